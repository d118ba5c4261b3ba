// The runtime's grpo keys: declared (defaults, overrides) and validated with messages naming the key.
#include <gtest/gtest.h>

#include "loom/config/grpo_environments.h"
#include "loom/config/run_config.h"
#include "loom/core/error.h"
#include "loom/rl/launch/server_command.h"

namespace loom::rl {
namespace {

std::string error_of(const std::vector<std::string>& overrides) {
  try {
    config::parse_config("model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, max_seq_len: 128}\n", "grpo_test", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrpoRuntimeConfig, DefaultsAndOverrides) {
  const std::string base = "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, max_seq_len: 128}\n";
  const config::RunConfig defaults = config::parse_config(base, "grpo_test", {});
  EXPECT_EQ(defaults.grpo.max_staleness, 1);
  EXPECT_EQ(defaults.grpo.environment, "countdown");
  EXPECT_EQ(defaults.grpo.episode_failure, "retry");
  EXPECT_EQ(defaults.grpo.inflight_updates, "continue");
  EXPECT_EQ(defaults.grpo.launch, "local");
  EXPECT_EQ(defaults.grpo.refit, "checkpoint");
  EXPECT_EQ(defaults.grpo.refit_bucket_mb, 64);
  EXPECT_EQ(defaults.grpo.register_timeout_s, 300.0);
  const config::RunConfig external =
      config::parse_config(base, "grpo_test", {"grpo.launch=external", "grpo.refit=comm", "grpo.refit_bucket_mb=8", "grpo.register_timeout_s=20"});
  EXPECT_EQ(external.grpo.launch, "external");
  EXPECT_EQ(external.grpo.refit, "comm");
  EXPECT_EQ(external.grpo.refit_bucket_mb, 8);
  EXPECT_EQ(external.grpo.register_timeout_s, 20.0);
  const config::RunConfig c = config::parse_config(
      base + "grpo: {environment: calculator, max_turns: 3, samples_per_prompt: 8, max_staleness: 0, episode_failure: drop}\n",
      "grpo_test", {"grpo.prompts_per_step=16", "grpo.inflight_updates=wait"});
  EXPECT_EQ(c.grpo.environment, "calculator");
  EXPECT_EQ(c.grpo.max_turns, 3);
  EXPECT_EQ(c.grpo.samples_per_prompt, 8);
  EXPECT_EQ(c.grpo.max_staleness, 0);
  EXPECT_EQ(c.grpo.prompts_per_step, 16);
  EXPECT_EQ(c.grpo.episode_failure, "drop");
  EXPECT_EQ(c.grpo.inflight_updates, "wait");
  // The config round-trips through the YAML a checkpoint stores.
  EXPECT_EQ(config::parse_config(config::to_yaml(c), "stored", {}).grpo.prompts_per_step, 16);
}

TEST(GrpoRuntimeConfig, BadValuesNameTheKey) {
  EXPECT_NE(error_of({"grpo.max_staleness=-1"}).find("grpo.max_staleness = -1 is invalid: must be >= 0"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environment=chess"}).find("grpo.environment"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environment=chess"}).find("arithmetic, countdown, calculator"), std::string::npos);
  EXPECT_NE(error_of({"grpo.episode_failure=ignore"}).find("retry, drop"), std::string::npos);
  EXPECT_NE(error_of({"grpo.inflight_updates=never"}).find("continue, wait"), std::string::npos);
  EXPECT_NE(error_of({"grpo.samples_per_prompt=0"}).find("grpo.samples_per_prompt"), std::string::npos);
  EXPECT_NE(error_of({"grpo.top_p=0"}).find("(0, 1]"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environment=calculator"}).find("grpo.max_turns = 1"), std::string::npos);
  EXPECT_NE(error_of({"grpo.launch=slurm"}).find("local, external"), std::string::npos);
  EXPECT_NE(error_of({"grpo.refit=nccl"}).find("checkpoint, comm"), std::string::npos);
  EXPECT_NE(error_of({"grpo.refit_bucket_mb=0"}).find("grpo.refit_bucket_mb"), std::string::npos);
  EXPECT_NE(error_of({"grpo.register_timeout_s=0"}).find("grpo.register_timeout_s"), std::string::npos);
  EXPECT_NE(error_of({"grpo.refit=comm"}).find("grpo.refit = 'comm' needs grpo.launch = 'external'"), std::string::npos);
  EXPECT_NE(error_of({"grpo.refit=comm", "grpo.launch=external", "grpo.inflight_updates=wait"}).find("inflight_updates = 'continue'"),
            std::string::npos);
  EXPECT_NE(error_of({"grpo.max_stalenes=1"}).find("did you mean"), std::string::npos);
}

// grpo.environments: each entry's zeros take the run's keys, names default to the task's, server
// processes are numbered across the environments in order, and a launcher's environment process
// of index p serves its environment's task with its settings.
TEST(GrpoRuntimeConfig, SeveralEnvironmentsResolveAgainstTheRunsKeys) {
  const std::string base = "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, max_seq_len: 128}\n";
  const config::RunConfig c = config::parse_config(
      base + "grpo: {task_digits: 3, max_tokens: 40, environments: [{task: countdown, weight: 3, task_numbers: 3},\n"
             "  {task: calculator, max_turns: 2, servers: 2, max_tokens: 24}, {name: sums, task: arithmetic, task_digits: 1}]}\n",
      "grpo_test", {});
  const std::vector<config::GrpoEnvironment> e = config::run_environments(c.grpo);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].name, "countdown");
  EXPECT_EQ(e[0].weight, 3.0);
  EXPECT_EQ(e[0].task_numbers, 3);
  EXPECT_EQ(e[0].task_digits, 3);
  EXPECT_EQ(e[0].max_turns, 1);
  EXPECT_EQ(e[0].max_tokens, 40);
  EXPECT_EQ(e[1].name, "calculator");
  EXPECT_EQ(e[1].max_turns, 2);
  EXPECT_EQ(e[1].max_tokens, 24);
  EXPECT_EQ(e[1].servers, 2);
  EXPECT_EQ(e[2].name, "sums");
  EXPECT_EQ(e[2].task, "arithmetic");
  EXPECT_EQ(e[2].task_digits, 1);
  EXPECT_EQ(e[2].task_numbers, 4);
  EXPECT_EQ(config::environment_server_count(c.grpo), 4);
  const std::vector<int> served = {0, 1, 1, 2};
  for (int p = 0; p < 4; ++p) EXPECT_EQ(config::environment_of_server(c.grpo, p), served[static_cast<size_t>(p)]) << p;
  EXPECT_THROW(config::environment_of_server(c.grpo, 4), Error);
  EXPECT_EQ(config::max_sample_tokens(c.grpo), 48) << "calculator's 2 turns x 24 tokens";
  const std::vector<std::string> third = rl::server_command(c, "environment", 3, "loom", "", "");
  EXPECT_EQ(third, (std::vector<std::string>{"loom", "env", "serve", "--task", "arithmetic", "--port", "0", "--seed",
                                             std::to_string(c.train.seed), "--digits", "1", "--numbers", "4"}));
  const std::vector<std::string> second = rl::server_command(c, "environment", 2, "loom", "", "");
  EXPECT_EQ(second[4], "calculator");
  EXPECT_EQ(second[10], "3") << "grpo.task_digits";
  // The config round-trips through the YAML a checkpoint stores.
  const config::RunConfig stored = config::parse_config(config::to_yaml(c), "stored", {});
  ASSERT_EQ(stored.grpo.environments.size(), 3u);
  EXPECT_EQ(stored.grpo.environments[2].name, "sums");
  EXPECT_EQ(stored.grpo.environments[1].servers, 2);
  // Without the list: the one environment of grpo.environment and its keys.
  const config::RunConfig one = config::parse_config(base, "grpo_test", {"grpo.environment=arithmetic", "grpo.environment_servers=2"});
  const std::vector<config::GrpoEnvironment> only = config::run_environments(one.grpo);
  ASSERT_EQ(only.size(), 1u);
  EXPECT_EQ(only[0].name, "arithmetic");
  EXPECT_EQ(only[0].servers, 2);
  EXPECT_EQ(only[0].task_digits, 2);
  EXPECT_EQ(config::max_sample_tokens(one.grpo), 32);
  // Entries without a task or servers take grpo.environment's and grpo.environment_servers'.
  const config::RunConfig two = config::parse_config(
      base, "grpo_test",
      {"grpo.environment=arithmetic", "grpo.environment_servers=2", "grpo.environments=[{name: a}, {task: countdown, servers: 1}]"});
  const std::vector<config::GrpoEnvironment> both = config::run_environments(two.grpo);
  ASSERT_EQ(both.size(), 2u);
  EXPECT_EQ(both[0].task, "arithmetic");
  EXPECT_EQ(both[0].servers, 2);
  EXPECT_EQ(both[1].task, "countdown");
  EXPECT_EQ(both[1].servers, 1);
  EXPECT_EQ(config::environment_server_count(two.grpo), 3);
}

TEST(GrpoRuntimeConfig, BadEnvironmentsNameTheEntryAndKey) {
  EXPECT_NE(error_of({"grpo.environments=[{task: chess}]"}).find("grpo.environments[0].task"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environments=[{task: chess}]"}).find("arithmetic, countdown, calculator"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environments=[{task: countdown}, {task: arithmetic, weight: 0}]"}).find("grpo.environments[1].weight"),
            std::string::npos);
  EXPECT_NE(error_of({"grpo.environments=[{task: countdown, task_numbers: 9}]"}).find("grpo.environments[0].task_numbers"),
            std::string::npos);
  EXPECT_NE(error_of({"grpo.environments=[{task: countdown, turns: 2}]"}).find("grpo.environments[0].turns"), std::string::npos);
  EXPECT_NE(error_of({"grpo.environments={task: countdown}"}).find("a list of maps"), std::string::npos);
  const std::string twice = error_of({"grpo.environments=[{task: countdown}, {task: countdown, task_numbers: 3}]"});
  EXPECT_NE(twice.find("grpo.environments[1].name = 'countdown' is also grpo.environments[0]'s"), std::string::npos) << twice;
  EXPECT_EQ(error_of({"grpo.environments=[{task: countdown}, {name: short, task: countdown, task_numbers: 3}]"}), "");
  const std::string turns = error_of({"grpo.environments=[{task: countdown}, {task: calculator}]"});
  EXPECT_NE(turns.find("grpo.max_turns = 1 with grpo.environments[1].task = 'calculator'"), std::string::npos) << turns;
  const std::string own = error_of({"grpo.environments=[{task: calculator, max_turns: 1}]", "grpo.max_turns=3"});
  EXPECT_NE(own.find("grpo.environments[0].max_turns = 1 with grpo.environments[0].task"), std::string::npos) << own;
  const std::string inherited = error_of({"grpo.environments=[{task: countdown}, {name: tools}]", "grpo.environment=calculator"});
  EXPECT_NE(inherited.find("grpo.max_turns = 1 with grpo.environment = 'calculator'"), std::string::npos) << inherited;
  EXPECT_NE(error_of({"grpo.environments=[{task: countdown, servers: -1}]"}).find("grpo.environments[0].servers"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::rl
