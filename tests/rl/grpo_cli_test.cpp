// `loom grpo` end to end: the controller starts an environment server, a generation worker and
// a tp 2 learner under `loom launch`; the test kills the environment server, then the worker,
// then the learner while the run goes on; every step is trained and the run exits 0. A tp 2 x pp 2
// learner refits a tp 1 worker bit for bit; a worker drafts with the depths the learner trains.
#include <dirent.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "../train/training_runs.h"
#include "loom/ckpt/checkpoint_root.h"
#include "loom/core/atomic_file.h"
#include "support/test_paths.h"

namespace loom::rl {
namespace {
using nlohmann::json;

int64_t rows_in(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) n += line.empty() ? 0 : 1;
  return n;
}

// A metrics file's rows, in order.
std::vector<json> metrics_rows(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(json::parse(line));
  }
  return rows;
}

// The pid of the learner process itself (not its `loom launch`), 0 when there is none.
pid_t learner_pid(const std::string& grpo_dir) {
  DIR* proc = opendir("/proc");
  pid_t found = 0;
  while (dirent* e = proc ? readdir(proc) : nullptr) {
    std::ifstream in(std::string("/proc/") + e->d_name + "/cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> argv;
    std::stringstream split(cmdline);
    for (std::string a; std::getline(split, a, '\0');) argv.push_back(a);
    if (argv.size() > 5 && argv[1] == "grpo" && argv[2] == "--role" && argv[3] == "learner" && argv[5] == grpo_dir)
      found = static_cast<pid_t>(std::stol(e->d_name));
  }
  if (proc) closedir(proc);
  return found;
}

// A tiny checkpoint trained for 2 steps under `root`, and a `loom grpo` config starting from it
// with the learner layout and grpo keys given (and more model keys); returns the config's path
// (its run.dir: root/grpo).
std::string grpo_config(const std::string& root, const std::string& train, const std::string& layout,
                        const std::string& grpo, const std::string& more_model = "") {
  const std::string model =
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
      "        positions: rope, tied_embeddings: false, max_seq_len: 128" + more_model + "}\n";
  train::testing::train_run(root, "tiny", model + "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 7}\n" +
                                              train::testing::data_section(root), {});
  std::ofstream(root + "/grpo.yaml") << "run: {dir: " << root << "/grpo}\n" << model
                                     << "data: {tokenizer: byte, seq_len: 128}\n" << train << "\n" << layout << "\n"
                                     << "grpo: {environment: arithmetic, task_digits: 1, samples_per_prompt: 2, "
                                        "prompts_per_step: 2, max_tokens: 4, worker_kv_cache_mb: 4, "
                                     << grpo << "}\n";
  return root + "/grpo.yaml";
}

TEST(GrpoCli, RunsEveryStepAndSurvivesKilledRoles) {
  const std::string root = train::testing::make_training_root("rl-grpo-cli");
  grpo_config(root,
              "optim: {lr: 1.0e-3, warmup_steps: 0}\ntrain: {steps: 6, global_batch: 4, micro_batch: 4, seed: 7, init_from: " +
                  root + "/tiny/checkpoints}",
              "runtime: {ranks: 2}\nparallel: {tp: 2}", "episode_retries: 6");
  const std::string run_dir = root + "/grpo";
  const std::string command = loom::test_paths::binary() + " grpo " + root + "/grpo.yaml > " + root + "/grpo.log 2>&1";
  int status = -1;
  std::thread run([&] { status = std::system(command.c_str()); });
  const std::string metrics = run_dir + "/metrics.jsonl", grpo_dir = run_dir + "/grpo";
  auto wait_rows = [&](int64_t n) {
    for (int i = 0; i < 3000 && rows_in(metrics) < n && status == -1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  auto role_pid = [&](const std::string& kind) {
    const json roles = json::parse(read_file(grpo_dir + "/roles.json"));
    return static_cast<pid_t>(roles["pids"][roles[kind][0].get<std::string>()].get<int64_t>());
  };
  wait_rows(1);
  if (status == -1) ::kill(role_pid("environments"), SIGKILL);
  wait_rows(2);
  if (status == -1) ::kill(role_pid("generation_workers"), SIGKILL);
  wait_rows(3);
  const pid_t learner = status == -1 ? learner_pid(grpo_dir) : 0;
  EXPECT_GT(learner, 0) << "the learner process was not found while the run went on";
  if (learner > 0) ::kill(learner, SIGKILL);
  run.join();
  const std::string log = read_file(root + "/grpo.log");
  const std::string learner_log = read_file(grpo_dir + "/logs/learner.log");
  EXPECT_EQ(status, 0) << log;
  EXPECT_EQ(rows_in(metrics), 6) << log;
  EXPECT_NE(log.find("environment 0 (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
  EXPECT_NE(learner_log.find("training finished on attempt 2"), std::string::npos) << learner_log;
}

// Refit from a tp 2 x pp 2 learner to a tp 1 worker: with grpo.verify_refit the worker's weights
// digest equals the learner's checkpoint's after every step (a mismatch would stop the run).
TEST(GrpoCli, RefitGivesTheWorkersTheLearnersWeightsBitForBit) {
  const std::string root = train::testing::make_training_root("rl-grpo-refit");
  grpo_config(root,
              "optim: {lr: 1.0e-2, warmup_steps: 0}\ntrain: {steps: 2, global_batch: 4, micro_batch: 2, seed: 7, init_from: " +
                  root + "/tiny/checkpoints}",
              "runtime: {ranks: 4}\nparallel: {tp: 2, pp: 2}", "verify_refit: true");
  const std::string run_dir = root + "/grpo";
  const int status = std::system((loom::test_paths::binary() + " grpo " + root + "/grpo.yaml > " + root + "/grpo.log 2>&1").c_str());
  const std::string log = read_file(root + "/grpo.log");
  ASSERT_EQ(status, 0) << log;
  std::ifstream in(run_dir + "/metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    ++rows;
    EXPECT_EQ(json::parse(line).value("refit_verified_workers", -1), 1) << line;
  }
  EXPECT_EQ(rows, 2) << log;
}

// grpo.worker_speculative_tokens with grpo.mtp_loss_weight: the worker drafts with the model's
// multi-token prediction depths and the learner trains them along; every metrics row holds the
// drafts the worker verified and kept since the previous one and each depth's loss, and the
// worker's weights (depths included) equal the learner's after every refit.
TEST(GrpoCli, TheWorkersDraftWithTheDepthsTheLearnerTrains) {
  const std::string root = train::testing::make_training_root("rl-grpo-drafts");
  grpo_config(root,
              "optim: {lr: 1.0e-3, warmup_steps: 0}\n"
              "train: {steps: 3, global_batch: 4, micro_batch: 4, seed: 7, init_from: " + root + "/tiny/checkpoints}",
              "runtime: {ranks: 2}\nparallel: {tp: 2}",
              "verify_refit: true, worker_speculative_tokens: 2, mtp_loss_weight: 0.3", ", mtp_depths: 2");
  const std::string command = loom::test_paths::binary() + " grpo " + root + "/grpo.yaml > " + root + "/grpo.log 2>&1";
  const int status = std::system(command.c_str());
  const std::string log = read_file(root + "/grpo.log");
  ASSERT_EQ(status, 0) << log;
  std::ifstream in(root + "/grpo/metrics.jsonl");
  int rows = 0;
  double drafted = 0.0, accepted = 0.0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    ++rows;
    const json row = json::parse(line);
    EXPECT_EQ(row.value("refit_verified_workers", -1), 1) << line;
    // Since the previous row: with max_staleness 1 a step's groups may all have been generated
    // before the previous row was written, so a row alone may count none.
    const json& drafts = row.at("spec_decode");
    EXPECT_LE(drafts.at("accepted_tokens").get<double>(), drafts.at("draft_tokens").get<double>()) << line;
    EXPECT_EQ(drafts.at("acceptance_rate_per_position").size(), drafts.at("drafts").get<double>() > 0 ? 2u : 0u) << line;
    drafted += drafts.at("draft_tokens").get<double>();
    accepted += drafts.at("accepted_tokens").get<double>();
    EXPECT_GT(row.at("learner").at("mtp_loss_2").get<double>(), 0.0) << line;
  }
  EXPECT_EQ(rows, 3) << log;
  EXPECT_GT(drafted, 0.0) << log;
  EXPECT_GT(accepted, 0.0) << log;
}

// A run whose controller is killed (SIGKILL: its roles and its learner end with it) goes on with
// train.resume=true from the learner's newest good checkpoint (the newest is corrupted here: the
// one before it, as the learner): every step's metrics row once and in order, new prompts for the
// resumed steps, validations of saved weights only, and the killed run's logs kept beside the
// new ones.
TEST(GrpoCli, AKilledRunResumesFromTheLearnersCheckpoint) {
  const std::string root = train::testing::make_training_root("rl-grpo-resume");
  grpo_config(root,
              "optim: {lr: 1.0e-3, warmup_steps: 0}\ntrain: {steps: 8, global_batch: 4, micro_batch: 4, seed: 7, init_from: " +
                  root + "/tiny/checkpoints}",
              "", "validation_prompts: 2, validation_interval: 2, validation_first_index: 500");
  const std::string run_dir = root + "/grpo", grpo_dir = run_dir + "/grpo", metrics = run_dir + "/metrics.jsonl";
  const std::string loom = loom::test_paths::binary() + " grpo " + root + "/grpo.yaml";
  int status = -1;
  std::thread first([&] {
    status = std::system(("sh -c 'echo $$ > " + root + "/controller.pid; exec " + loom + "' > " + root + "/first.log 2>&1").c_str());
  });
  for (int i = 0; i < 3000 && rows_in(metrics) < 3 && status == -1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(status, -1) << "the run ended before it was killed: " << read_file(root + "/first.log");
  ::kill(static_cast<pid_t>(std::stol(read_file(root + "/controller.pid"))), SIGKILL);
  first.join();
  // Its children end on their parent's death; the learner's run directory stays locked until then.
  for (int i = 0; i < 1500 && learner_pid(grpo_dir) != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(learner_pid(grpo_dir), 0) << "the killed run's learner is still there";
  const int64_t killed_at = rows_in(metrics);
  ASSERT_LT(killed_at, 8) << "the run finished before it was killed";
  // The newest checkpoint corrupt (its shard cut short): the learner falls back to the one
  // before, and the controller must go on from that same one.
  const std::string checkpoints = run_dir + "/learner/checkpoints";
  const int64_t newest = ckpt::parse_step_dir_name(ckpt::read_latest(checkpoints).value()).value();
  std::filesystem::resize_file(checkpoints + "/" + ckpt::step_dir_name(newest) + "/rank-00000.bin", 16);

  status = std::system((loom + " train.resume=true > " + root + "/second.log 2>&1").c_str());
  const std::string log = read_file(root + "/second.log");
  ASSERT_EQ(status, 0) << log;
  std::smatch found;
  ASSERT_TRUE(std::regex_search(log, found, std::regex("resuming at step (\\d+) from \\S+/step-0*(\\d+), prompts from (\\d+) on")))
      << log;
  const int64_t resumed_at = std::stoll(found[1].str()), first_prompt = std::stoll(found[3].str());
  EXPECT_EQ(std::stoll(found[2].str()), resumed_at);
  EXPECT_GE(newest, 3) << "step 2 was reported, so its weights (step 3) were saved";
  EXPECT_EQ(resumed_at, newest - 1) << "not the learner's fallback from the corrupt step " << newest;
  EXPECT_GE(first_prompt, 2 * (resumed_at - 1)) << "the killed run drew at least the prompts of the steps it reported";
  const std::string learner_log = read_file(grpo_dir + "/logs/learner.log");
  EXPECT_NE(learner_log.find("resumed from " + run_dir + "/learner/checkpoints/" + ckpt::step_dir_name(resumed_at)),
            std::string::npos) << learner_log;
  EXPECT_TRUE(std::filesystem::exists(grpo_dir + "/logs.1/learner.log")) << "the killed run's logs were not kept";
  std::ifstream in(metrics);
  int64_t expected = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json row = json::parse(line);
    EXPECT_EQ(row["step"], expected) << line;
    EXPECT_EQ(row["weight_version"], expected + 1) << line;
    ++expected;
  }
  EXPECT_EQ(expected, 8) << log;
  const json progress = json::parse(read_file(grpo_dir + "/progress.json"));
  EXPECT_EQ(progress["steps_done"], 8);
  EXPECT_GE(progress["next_prompt"].get<int64_t>(), first_prompt + 2 * (8 - resumed_at)) << progress.dump();
  std::ifstream validations(run_dir + "/validation.jsonl");
  std::vector<int64_t> versions;
  for (std::string line; std::getline(validations, line);) {
    if (!line.empty()) versions.push_back(json::parse(line)["weight_version"].get<int64_t>());
  }
  EXPECT_EQ(versions, (std::vector<int64_t>{0, 2, 4, 6, 8}));
}

// A stop after the learner saved a step's weights but before the controller wrote that step's
// row (it writes it after the refit the step ends with): the row reported before the refit is
// kept in progress.json, and the resumed run writes it, marked, before going on; where the row
// was written already it is not written twice. Both stops are made from a finished run's files.
TEST(GrpoCli, AStopBeforeAReportedStepsRowLosesNoRow) {
  const std::string root = train::testing::make_training_root("rl-grpo-unwritten-row");
  grpo_config(root,
              "optim: {lr: 1.0e-3, warmup_steps: 0}\ntrain: {steps: 4, global_batch: 4, micro_batch: 4, seed: 7, init_from: " +
                  root + "/tiny/checkpoints}",
              "", "");
  const std::string run_dir = root + "/grpo", grpo_dir = run_dir + "/grpo", metrics = run_dir + "/metrics.jsonl";
  const std::string loom = loom::test_paths::binary() + " grpo " + root + "/grpo.yaml";
  ASSERT_EQ(std::system((loom + " > " + root + "/first.log 2>&1").c_str()), 0) << read_file(root + "/first.log");
  const std::vector<json> rows = metrics_rows(metrics);
  ASSERT_EQ(rows.size(), 4u);
  const json progress = json::parse(read_file(grpo_dir + "/progress.json"));
  ASSERT_EQ(progress["steps_done"], 4);
  EXPECT_FALSE(progress.contains("reported_row")) << "a finished step keeps no reported row: " << progress.dump();
  // Step 3 reported (its weights are the learner's newest checkpoint, step 4), its row as it
  // stood before the refit.
  json reported = rows[3];
  reported.erase("refit_s");
  const json stopped = {{"steps_done", 3}, {"next_prompt", progress["next_prompt"]}, {"reported_row", reported}};
  auto resume = [&](bool row_written, int64_t steps) {
    std::string kept;
    for (size_t i = 0; i < (row_written ? 4u : 3u); ++i) kept += rows[i].dump() + "\n";
    write_file_atomic(metrics, kept);
    write_file_atomic(grpo_dir + "/progress.json", stopped.dump() + "\n");
    const std::string log_path = root + "/resumed-" + std::to_string(steps) + ".log";
    const int status =
        std::system((loom + " train.resume=true train.steps=" + std::to_string(steps) + " > " + log_path + " 2>&1").c_str());
    const std::string log = read_file(log_path);
    EXPECT_EQ(status, 0) << log;
    EXPECT_NE(log.find("resuming at step 4 from"), std::string::npos) << log;
    EXPECT_EQ(log.find("step 3's metrics row, reported before the stop but not written, written now") != std::string::npos,
              !row_written) << log;
    const std::vector<json> now = metrics_rows(metrics);
    ASSERT_EQ(now.size(), static_cast<size_t>(steps)) << log;
    for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i]["step"], static_cast<int64_t>(i)) << now[i].dump();
    json expected = row_written ? rows[3] : reported;
    if (!row_written) expected["refit_interrupted"] = true;
    EXPECT_EQ(now[3], expected);
  };
  resume(/*row_written=*/false, 5);
  // The learner's newest is step 5 now: go back to step 4's state for the second stop.
  const std::string checkpoints = run_dir + "/learner/checkpoints";
  std::filesystem::remove_all(checkpoints + "/" + ckpt::step_dir_name(5));
  ckpt::write_latest(checkpoints, ckpt::step_dir_name(4));
  resume(/*row_written=*/true, 6);
}

}  // namespace
}  // namespace loom::rl
