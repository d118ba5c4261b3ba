// What a run never loses and how it always ends, met as a user meets them: a run directory holding
// another run is refused (or replaced on request), a second trainer on one run.dir is refused, an
// unusable checkpoint directory is found before the first step, resume compares the config and
// train.steps with the checkpoint's, SIGINT exits with its own status after a checkpoint, and a
// rank stuck outside a collective ends the job instead of hanging it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "loom/ckpt/manifest.h"
#include "support/test_paths.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;

bool has(const CommandResult& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

size_t lines_of(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

class RunSafetyCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(prepare_small_corpus(dir.path(), 200, 0.0).exit_code, 0);
    write_text(dir / "config.yaml",
               "run: {dir: " + (dir / "run") + "}\n"
               "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 64, max_seq_len: 64}\n"
               "data: {tokenizer: byte, train_prefix: " + (dir / "data/c_train") + ", seq_len: 32}\n"
               "optim: {lr: 3.0e-3, warmup_steps: 1}\n"
               "train: {steps: 3, global_batch: 2, micro_batch: 2, threads: 1}\n"
               "log: {progress: false}\n");
  }
  CommandResult train(const std::string& overrides) { return run_loom("train " + (dir / "config.yaml") + " " + overrides); }

  TempDir dir;
};

TEST_F(RunSafetyCli, AFreshRunDoesNotTakeOverAnotherRunsDirectory) {
  ASSERT_EQ(train("").exit_code, 0);
  ASSERT_EQ(lines_of(dir / "run/metrics.jsonl"), 3u);
  const CommandResult again = train("train.steps=2");
  EXPECT_EQ(again.exit_code, 1);
  EXPECT_TRUE(has(again, "holds another run")) << again.output;
  EXPECT_TRUE(has(again, "train.resume=true") && has(again, "run.overwrite=true")) << again.output;
  EXPECT_EQ(lines_of(dir / "run/metrics.jsonl"), 3u);  // nothing of the first run was touched
  EXPECT_TRUE(fs::exists(dir / "run/checkpoints/step-00000003"));

  const CommandResult replaced = train("train.steps=2 run.overwrite=true");
  ASSERT_EQ(replaced.exit_code, 0) << replaced.output;
  EXPECT_EQ(lines_of(dir / "run/metrics.jsonl"), 2u);
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step-00000003"));
}

TEST_F(RunSafetyCli, CheckpointAtEndFalseLeavesNoCheckpointBehind) {
  const CommandResult r = train("checkpoint.at_end=false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_of(dir / "run/metrics.jsonl"), 3u);
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step-00000003"));
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/latest"));
  // An interval checkpoint is still written.
  const CommandResult every = train("checkpoint.at_end=false checkpoint.interval=2 run.overwrite=true");
  ASSERT_EQ(every.exit_code, 0) << every.output;
  EXPECT_TRUE(fs::exists(dir / "run/checkpoints/step-00000002"));
  EXPECT_FALSE(fs::exists(dir / "run/checkpoints/step-00000003"));
}

TEST_F(RunSafetyCli, ASecondTrainerOnOneRunDirectoryIsRefused) {
  fs::create_directories(dir / "run");
  // This process holds the lock as a running trainer would.
  const int fd = ::open((dir / "run/loom.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const CommandResult second = train("");
  EXPECT_EQ(second.exit_code, 1);
  EXPECT_TRUE(has(second, "is in use by another loom run")) << second.output;
  ::close(fd);  // a lock of a process that ended is no obstacle
  EXPECT_EQ(train("").exit_code, 0);
}

TEST_F(RunSafetyCli, AnUnusableCheckpointDirectoryIsFoundBeforeTheFirstStep) {
  fs::create_directories(dir / "run");
  write_text(dir / "run/checkpoints", "a file where the checkpoints would go");
  const CommandResult r = train("");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r, "checkpoint directory") && has(r, "cannot be created")) << r.output;
  EXPECT_FALSE(has(r, "step 1/")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "run/metrics.jsonl"));
}

TEST_F(RunSafetyCli, ResumeComparesTheConfigAndTheStepsWithTheCheckpoint) {
  ASSERT_EQ(train("").exit_code, 0);
  const CommandResult lr = train("train.resume=true train.steps=4 optim.lr=1e-3");
  ASSERT_EQ(lr.exit_code, 0) << lr.output;
  EXPECT_TRUE(has(lr, "settings changed since the checkpoint: optim.lr 0.003 -> 0.001")) << lr.output;
  const CommandResult rope = train("train.resume=true train.steps=5 model.rope_theta=500000");
  EXPECT_EQ(rope.exit_code, 1);
  EXPECT_TRUE(has(rope, "was trained with another model: model.rope_theta")) << rope.output;
  const CommandResult done = train("train.resume=true train.steps=4");
  EXPECT_EQ(done.exit_code, 0) << done.output;
  EXPECT_TRUE(has(done, "already complete")) << done.output;
  EXPECT_FALSE(has(done, "trained steps")) << done.output;
  const CommandResult behind = train("train.resume=true train.steps=2");
  EXPECT_EQ(behind.exit_code, 1);
  EXPECT_TRUE(has(behind, "train.steps = 2 is behind the checkpoint")) << behind.output;
}

// Rewrites the checkpoint's manifest.json with `edit` applied to its trainer state (checksum renewed).
void edit_state(const std::string& manifest, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(manifest);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ckpt::Manifest m = ckpt::parse_manifest(text, manifest);
  edit(m.state);
  write_text(manifest, ckpt::serialize_manifest(m));
}

TEST_F(RunSafetyCli, ResumeNamesAMistypedOrMissingKeyOfTheCheckpointsState) {
  ASSERT_EQ(train("").exit_code, 0);
  const std::string manifest = dir / "run/checkpoints/step-00000003/manifest.json";
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& s) { s.erase("step"); }, "state: missing key 'step'"},
      {[](nlohmann::json& s) { s["consumed_samples"] = "abc"; }, "state: 'consumed_samples' must be a non-negative"},
      {[](nlohmann::json& s) { s["precision"] = 5; }, "state.precision: expected a JSON object"},
      {[](nlohmann::json& s) { s["precision"]["skipped_steps"] = nullptr; }, "state.precision: 'skipped_steps' must"},
      {[](nlohmann::json& s) { s["precision"]["loss_scale"] = "x"; }, "state.precision: 'loss_scale' must be a number"},
      {[](nlohmann::json& s) { s["precision"].erase("clean_steps"); }, "state.precision: missing key 'clean_steps'"},
  };
  for (const auto& [edit, message] : cases) {
    std::ifstream in(manifest);
    const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    edit_state(manifest, edit);
    const CommandResult r = train("train.resume=true train.steps=4");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(has(r, manifest + "' " + message)) << r.output;
    EXPECT_FALSE(has(r, "unexpected error")) << r.output;
    write_text(manifest, original);
  }
  EXPECT_EQ(train("train.resume=true train.steps=4").exit_code, 0);
}

// Starts `loom args` with its output in `log`; returns the child's pid.
pid_t start_loom(const std::string& args, const std::string& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string command = loom::test_paths::binary() + " " + args + " > " + log + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

// Waits up to `limit` for `pid`; its exit status, or -1 when it is still running (then killed).
int wait_exit(pid_t pid, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST_F(RunSafetyCli, SigintStopsAfterACheckpointWithItsOwnExitStatus) {
  const pid_t pid = start_loom("train " + (dir / "config.yaml") + " train.steps=100000", dir / "log");
  // Wait for the first step, then interrupt.
  for (int i = 0; i < 600 && lines_of(dir / "run/metrics.jsonl") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(lines_of(dir / "run/metrics.jsonl"), 0u) << read_all(dir / "log");
  ::kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid, std::chrono::seconds(60)), 128 + SIGINT) << read_all(dir / "log");
  EXPECT_NE(read_all(dir / "log").find("interrupted at step"), std::string::npos) << read_all(dir / "log");
  EXPECT_TRUE(fs::exists(dir / "run/checkpoints/latest"));
}

TEST_F(RunSafetyCli, ARankStuckOutsideACollectiveEndsTheJob) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = start_loom("train " + (dir / "config.yaml") +
                                   " train.steps=6 runtime.ranks=2 train.micro_batch=1 fault.stall_rank=1"
                                   " fault.stall_step=2 runtime.timeout_s=2",
                               dir / "log");
  EXPECT_EQ(wait_exit(pid, std::chrono::seconds(30)), 1) << read_all(dir / "log");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  const std::string log = read_all(dir / "log");
  EXPECT_NE(log.find("never arrived"), std::string::npos) << log;
  EXPECT_NE(log.find("rank(s) 1 did not stop"), std::string::npos) << log;
}

TEST_F(RunSafetyCli, ASecondSignalEndsAStuckJobAtOnce) {
  const pid_t pid = start_loom("train " + (dir / "config.yaml") +
                                   " train.steps=6 runtime.ranks=2 train.micro_batch=1 fault.stall_rank=1"
                                   " fault.stall_step=2 runtime.timeout_s=600",
                               dir / "log");
  for (int i = 0; i < 600 && read_all(dir / "log").find("stalls at step") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid, std::chrono::seconds(10)), 128 + SIGTERM) << read_all(dir / "log");
  EXPECT_NE(read_all(dir / "log").find("second signal"), std::string::npos) << read_all(dir / "log");
}

}  // namespace
}  // namespace loom::testing
