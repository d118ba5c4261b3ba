#include "loom/config/grpo_schema.h"

#include <string>

#include "loom/core/error.h"

namespace loom::config {

namespace detail {

namespace {
// grpo.top_p: a nucleus of (0, 1].
Check<double> nucleus() {
  return [](const double& value) -> std::optional<std::string> {
    if (value > 0.0 && value <= 1.0) return std::nullopt;
    return std::string("must be in (0, 1]");
  };
}
}  // namespace

std::vector<Key<GrpoConfig>> grpo_keys() {
  return {
      field("environment", &GrpoConfig::environment, one_of({"arithmetic", "countdown", "calculator"})),
      field("task_digits", &GrpoConfig::task_digits, in_range(1, 9, "")),
      field("task_numbers", &GrpoConfig::task_numbers, in_range(2, 8, "")),
      field("samples_per_prompt", &GrpoConfig::samples_per_prompt, at_least(1)),
      field("prompts_per_step", &GrpoConfig::prompts_per_step, at_least(1)),
      field("max_turns", &GrpoConfig::max_turns, at_least(1)),
      field("max_tokens", &GrpoConfig::max_tokens, at_least(1)),
      field("temperature", &GrpoConfig::temperature, greater_than(0)),
      field("top_p", &GrpoConfig::top_p, nucleus()),
      field("generation_workers", &GrpoConfig::generation_workers, at_least(1)),
      field("environment_servers", &GrpoConfig::environment_servers, at_least(1)),
      field("worker_kv_cache_mb", &GrpoConfig::worker_kv_cache_mb, at_least(1)),
      field("rollout_threads", &GrpoConfig::rollout_threads, at_least(0)),
      field("max_staleness", &GrpoConfig::max_staleness, at_least(0)),
      field("inflight_updates", &GrpoConfig::inflight_updates, one_of({"continue", "wait"})),
      field("episode_failure", &GrpoConfig::episode_failure, one_of({"retry", "drop"})),
      field("episode_retries", &GrpoConfig::episode_retries, at_least(0)),
      field("generation_timeout_s", &GrpoConfig::generation_timeout_s, greater_than(0)),
      field("environment_timeout_s", &GrpoConfig::environment_timeout_s, greater_than(0)),
      field("step_timeout_s", &GrpoConfig::step_timeout_s, greater_than(0)),
      field("max_role_restarts", &GrpoConfig::max_role_restarts, at_least(0)),
  };
}

}  // namespace detail

void check_grpo(const RunConfig& config) {
  const GrpoConfig& g = config.grpo;
  LOOM_CHECK(g.environment != "calculator" || g.max_turns >= 2,
             "grpo.max_turns = " + std::to_string(g.max_turns) +
                 " with grpo.environment = 'calculator': a tool call needs a second turn for the answer; use >= 2");
}

}  // namespace loom::config
