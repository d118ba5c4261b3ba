// The controller over real processes: `loom env serve` and `loom serve` started by it, the
// learner's protocol (GET /batch, POST /step_done) driven by the test, refits that move every
// worker's weight_version, a killed environment server and a killed worker restarted while the
// run goes on, one metrics row per step.
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "../train/training_runs.h"
#include "loom/core/atomic_file.h"
#include "loom/rl/controller/controller.h"
#include "loom/rl/http_json.h"
#include "loom/rl/learner_client.h"
#include "support/test_paths.h"

namespace loom::rl {
namespace {
using nlohmann::json;

const char* kModel =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
    "        positions: rope, tied_embeddings: false, max_seq_len: 128}\n"
    "optim: {lr: 3.0e-3}\n";

struct GrpoRun {
  std::string root, checkpoint;
  GrpoRun() {
    root = train::testing::make_training_root("rl-controller");
    train::testing::train_run(root, "tiny", std::string(kModel) + "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 7}\n" +
                                                train::testing::data_section(root), {});
    checkpoint = root + "/tiny/checkpoints";
  }
  config::RunConfig config(const std::string& name, const std::vector<std::string>& overrides) const {
    return config::parse_config("run: {dir: " + root + "/" + name + "}\n" + std::string(kModel) +
                                    "train: {steps: 3, global_batch: 4, micro_batch: 4, seed: 7, init_from: " + checkpoint + "}\n" +
                                    train::testing::data_section(root) +
                                    "grpo: {environment: arithmetic, task_digits: 1, samples_per_prompt: 2, prompts_per_step: 2,\n"
                                    "       max_tokens: 4, worker_kv_cache_mb: 4, generation_timeout_s: 60, environment_timeout_s: 5,\n"
                                    "       step_timeout_s: 120}\n",
                                "controller_test", overrides);
  }
};

// One trained checkpoint per test binary; each test its own run.dir.
const GrpoRun& grpo_run() {
  static const GrpoRun made;
  return made;
}

std::vector<json> metric_rows(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) rows.push_back(json::parse(line));
  return rows;
}

// The worker's weight_version once it answers (a killed worker is being restarted meanwhile).
std::string worker_version(Controller& c, const std::string& expected) {
  std::string seen;
  for (int i = 0; i < 600 && seen != expected; ++i) {
    try {
      seen = get_json(c.roles().worker_url(0), "/v1/models", 5.0).body["data"][0]["weight_version"].get<std::string>();
    } catch (const HttpFailure&) {
    }
    if (seen != expected) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return seen;
}

// The controller's run on a thread of its own, started from the trained checkpoint: its exit
// status or error once joined. A test that leaves early (a failed assertion) stops and joins it.
struct ControllerThread {
  explicit ControllerThread(const config::RunConfig& config) : controller(config, options(), log) {
    thread = std::thread([this] {
      try {
        status = controller.run();
      } catch (const std::exception& e) {
        failure = e.what();
      }
    });
  }
  ~ControllerThread() {
    if (!thread.joinable()) return;
    controller.request_stop();
    thread.join();
  }
  static ControllerOptions options() {
    ControllerOptions o;
    o.loom_binary = loom::test_paths::binary();
    o.initial_checkpoint = grpo_run().checkpoint;
    return o;
  }
  std::ostringstream log;
  Controller controller;
  int status = -1;
  std::string failure;
  std::thread thread;
};

TEST(Controller, ServesStepsRefitsWorkersAndRestartsDeadRoles) {
  const GrpoRun& run = grpo_run();
  const config::RunConfig config = run.config("faults", {"grpo.max_staleness=1"});
  ControllerThread running(config);
  const std::string grpo_dir = config.run.dir + "/grpo";
  LearnerClient learner(find_controller(grpo_dir, 120.0), 120.0);
  const json roles = json::parse(read_file(grpo_dir + "/roles.json"));
  EXPECT_EQ(roles["environments"].size(), 1u);
  EXPECT_EQ(roles["generation_workers"].size(), 1u);
  EXPECT_EQ(worker_version(running.controller, "step-0"), "step-0") << "a worker serves the starting weights as version 0";
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<RolloutGroup> groups = groups_of_batch(learner.batch_text(step), step);
    ASSERT_EQ(groups.size(), 2u);
    for (const RolloutGroup& g : groups) {
      EXPECT_GE(g.weight_version, step - 1) << "step " << step;
      ASSERT_EQ(g.samples.size(), 2u);
      EXPECT_EQ(g.samples[0].environment, "arithmetic");
    }
    // The same step asked again (a restarted learner) gets the same groups.
    EXPECT_EQ(groups_of_batch(learner.batch_text(step), step)[0].prompt_index, groups[0].prompt_index);
    if (step == 1) running.controller.roles().kill("environment", 0);
    EXPECT_EQ(learner.step_done(step, run.checkpoint + "/step-00000002", {{"loss", 0.5}}), "step-" + std::to_string(step + 1));
    if (step < 2) {
      EXPECT_EQ(worker_version(running.controller, "step-" + std::to_string(step + 1)), "step-" + std::to_string(step + 1));
    }
    if (step == 0) running.controller.roles().kill("worker", 0);
  }
  running.thread.join();
  ASSERT_EQ(running.failure, "") << running.log.str();
  EXPECT_EQ(running.status, 0) << running.log.str();
  EXPECT_NE(running.log.str().find("environment 0 (pid"), std::string::npos);
  EXPECT_NE(running.log.str().find("restarting it"), std::string::npos) << running.log.str();
  const std::vector<json> rows = metric_rows(config.run.dir + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  int64_t restarts = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& r = rows[i];
    EXPECT_EQ(r["step"], static_cast<int64_t>(i));
    EXPECT_EQ(r["groups"], 2);
    EXPECT_EQ(r["samples"], 4);
    EXPECT_GE(r["reward_mean"].get<double>(), 0.0);
    EXPECT_LE(r["reward_mean"].get<double>(), 1.0);
    EXPECT_TRUE(r["reward"].contains("arithmetic"));
    EXPECT_TRUE(r.contains("learner_wait_s") && r.contains("staleness") && r.contains("evicted") &&
                r.contains("generation_tokens_per_s") && r.contains("learner_tokens_per_s"));
    EXPECT_EQ(r["learner"]["loss"], 0.5);
    EXPECT_EQ(r["weight_version"], static_cast<int64_t>(i) + 1);
    restarts = r["role_restarts"].get<int64_t>();
  }
  EXPECT_GE(restarts, 1) << running.log.str();
}

// max_staleness 0: every group of step s was generated by the weights of step s (after the
// refit of step s - 1): the staleness histogram holds only 0. Refits wait for groups in flight.
TEST(Controller, SynchronousRunTrainsOnlyOnTheCurrentVersion) {
  const config::RunConfig config = grpo_run().config("synchronous", {"grpo.max_staleness=0", "train.steps=2", "grpo.inflight_updates=wait"});
  ControllerThread running(config);
  LearnerClient learner(find_controller(config.run.dir + "/grpo", 120.0), 120.0);
  for (int64_t step = 0; step < 2; ++step) {
    for (const RolloutGroup& g : groups_of_batch(learner.batch_text(step), step)) EXPECT_EQ(g.weight_version, step);
    learner.step_done(step, grpo_run().checkpoint + "/step-00000002", json::object());
  }
  running.thread.join();
  for (const json& row : metric_rows(config.run.dir + "/metrics.jsonl")) EXPECT_EQ(row["staleness"], json({{"0", 2}})) << row.dump();
}

// Validation: the held-out prompts (task indices from grpo.validation_first_index) are answered
// before training and every validation_interval steps, after the refit. Every refit here loads
// the starting weights again, so each validation must measure the same reward.
TEST(Controller, ValidatesHeldOutPromptsBeforeTrainingAndEveryInterval) {
  const GrpoRun& run = grpo_run();
  const config::RunConfig config = run.config("validation", {"train.steps=3", "grpo.max_staleness=0", "grpo.validation_prompts=12",
                                                             "grpo.validation_interval=2", "grpo.validation_first_index=500"});
  ControllerThread running(config);
  LearnerClient learner(find_controller(config.run.dir + "/grpo", 120.0), 120.0);
  for (int64_t step = 0; step < 3; ++step) {
    groups_of_batch(learner.batch_text(step), step);
    learner.step_done(step, run.checkpoint + "/step-00000002", json::object());
  }
  running.thread.join();
  const std::vector<json> validations = metric_rows(config.run.dir + "/validation.jsonl");
  ASSERT_EQ(validations.size(), 3u) << running.log.str();
  const std::vector<int64_t> versions = {0, 2, 3};  // before training, after step 2 of the interval, after the last
  for (size_t i = 0; i < validations.size(); ++i) {
    const json& v = validations[i];
    EXPECT_EQ(v["weight_version"], versions[i]);
    EXPECT_EQ(v["prompts"], 12);
    EXPECT_EQ(v["samples"], 12);
    EXPECT_EQ(v["failed_prompts"], 0);
    EXPECT_EQ(v["reward_mean"], validations[0]["reward_mean"]) << "the same weights, the same greedy answers";
    EXPECT_EQ(v["truncated"], validations[0]["truncated"]);
  }
  const std::vector<json> rows = metric_rows(config.run.dir + "/metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_FALSE(rows[0].contains("validation"));
  EXPECT_EQ(rows[1]["validation"]["weight_version"], 2);
  EXPECT_EQ(rows[2]["validation"]["weight_version"], 3);
}

// grpo.environments: prompts drawn from an arithmetic environment (named "sums", weight 2) and a
// countdown one (two servers) as the prompt mix assigns them, every group's samples named by their
// environment (each episode checks its server serves that task), rewards per environment in the
// metrics rows, roles.json naming each server's environment, and validation per environment.
TEST(Controller, DrawsPromptsFromSeveralEnvironmentsByWeight) {
  const GrpoRun& run = grpo_run();
  const config::RunConfig config = run.config(
      "mixed", {"grpo.environments=[{name: sums, weight: 2}, {task: countdown, task_numbers: 2, servers: 2}]",
                "train.steps=3", "grpo.prompts_per_step=3", "grpo.max_staleness=0", "grpo.validation_prompts=3",
                "grpo.validation_interval=3", "grpo.validation_first_index=500"});
  ControllerThread running(config);
  const std::string grpo_dir = config.run.dir + "/grpo";
  LearnerClient learner(find_controller(grpo_dir, 120.0), 120.0);
  const json roles = json::parse(read_file(grpo_dir + "/roles.json"));
  EXPECT_EQ(roles["environments"].size(), 3u);
  EXPECT_EQ(roles["environment_names"], json({"sums", "countdown", "countdown"}));
  // Which prompt n each (environment, task index) is.
  const PromptMix mix(config.grpo);
  std::map<std::pair<std::string, int64_t>, int64_t> prompt_of;
  for (int64_t n = 0; n < 1000; ++n) {
    const EnvironmentPrompt p = mix.at(n);
    prompt_of[{p.environment == 0 ? "sums" : "countdown", p.task_index}] = n;
  }
  std::set<int64_t> prompts;
  std::map<std::string, int64_t> groups_of;
  for (int64_t step = 0; step < 3; ++step) {
    for (const RolloutGroup& g : groups_of_batch(learner.batch_text(step), step)) {
      ASSERT_EQ(g.samples.size(), 2u);
      const std::string name = g.samples[0].environment;
      EXPECT_EQ(g.samples[1].environment, name);
      ASSERT_TRUE(prompt_of.count({name, g.prompt_index})) << name << " task " << g.prompt_index;
      EXPECT_TRUE(prompts.insert(prompt_of[{name, g.prompt_index}]).second) << "prompt drawn twice";
      ++groups_of[name];
    }
    learner.step_done(step, run.checkpoint + "/step-00000002", json::object());
  }
  running.thread.join();
  ASSERT_EQ(running.failure, "") << running.log.str();
  EXPECT_EQ(running.status, 0) << running.log.str();
  EXPECT_GT(groups_of["sums"], 0);
  EXPECT_GT(groups_of["countdown"], 0) << running.log.str();
  EXPECT_NE(running.log.str().find("(environment 'countdown')"), std::string::npos) << running.log.str();
  std::map<std::string, int64_t> samples_of;
  for (const json& row : metric_rows(config.run.dir + "/metrics.jsonl")) {
    int64_t samples = 0;
    for (const auto& [name, summary] : row["reward"].items()) {
      EXPECT_TRUE(name == "sums" || name == "countdown") << name;
      samples += summary["samples"].get<int64_t>();
      samples_of[name] += summary["samples"].get<int64_t>();
    }
    EXPECT_EQ(samples, row["samples"]);
  }
  EXPECT_EQ(samples_of["sums"], 2 * groups_of["sums"]);
  EXPECT_EQ(samples_of["countdown"], 2 * groups_of["countdown"]);
  const std::vector<json> validations = metric_rows(config.run.dir + "/validation.jsonl");
  ASSERT_EQ(validations.size(), 2u) << running.log.str();  // before training and after the last step
  for (const json& v : validations) {
    EXPECT_EQ(v["prompts"], 6);
    EXPECT_EQ(v["failed_prompts"], 0);
    for (const char* name : {"sums", "countdown"}) {
      EXPECT_EQ(v["environments"][name]["prompts"], 3) << v.dump();
      EXPECT_EQ(v["environments"][name]["samples"], 3) << v.dump();
    }
    const double mean = (v["environments"]["sums"]["reward_mean"].get<double>() +
                         v["environments"]["countdown"]["reward_mean"].get<double>()) / 2;
    EXPECT_NEAR(v["reward_mean"].get<double>(), mean, 1e-12);
  }
}

// grpo.dynamic_sampling keeps only groups whose samples' rewards differ.
TEST(DynamicSampling, AGroupIsRewardedAlikeOnlyWhenEverySampleHasTheSameReward) {
  RolloutGroup group;
  group.samples.resize(4);
  EXPECT_TRUE(rewarded_alike(group));
  for (Rollout& s : group.samples) s.reward = 0.1;
  EXPECT_TRUE(rewarded_alike(group));
  group.samples[3].reward = 1.0;
  EXPECT_FALSE(rewarded_alike(group));
  group.samples[3].reward = 0.1;
  group.samples[0].reward = 0.0;
  EXPECT_FALSE(rewarded_alike(group));
}

// The test model never answers right: every group is rewarded alike (0), so dynamic sampling
// drops them all and the run fails after dynamic_sampling_max_draws x prompts_per_step of them
// in a row, naming the key, with no step trained.
TEST(Controller, DynamicSamplingDropsGroupsRewardedAlikeAndFailsWhenNothingElseComes) {
  const config::RunConfig config = grpo_run().config("dynamic", {"grpo.dynamic_sampling=true", "grpo.dynamic_sampling_max_draws=2",
                                                                 "grpo.step_timeout_s=60"});
  std::ostringstream log;
  ControllerOptions options;
  options.loom_binary = loom::test_paths::binary();
  options.initial_checkpoint = grpo_run().checkpoint;
  Controller controller(config, options, log);
  std::string failure;
  try {
    controller.run();
  } catch (const Error& e) {
    failure = e.what();
  }
  EXPECT_NE(failure.find("grpo.dynamic_sampling dropped 4 groups in a row"), std::string::npos) << failure << "\n" << log.str();
  EXPECT_NE(failure.find("grpo.dynamic_sampling_max_draws"), std::string::npos) << failure;
}

TEST(Controller, RefusesARunWithoutStartingWeights) {
  const config::RunConfig config = grpo_run().config("no-weights", {});
  std::ostringstream log;
  ControllerOptions options;
  options.loom_binary = loom::test_paths::binary();
  EXPECT_THROW(Controller(config, options, log), Error);
}

}  // namespace
}  // namespace loom::rl
