// The runtime's grpo keys: declared (defaults, overrides) and validated with messages naming the key.
#include <gtest/gtest.h>

#include "loom/config/run_config.h"
#include "loom/core/error.h"

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

}  // namespace
}  // namespace loom::rl
