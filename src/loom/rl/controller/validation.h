#pragma once
// Validation of a GRPO run (docs/grpo.md, "Validation"): the mean reward of held-out prompts under
// the workers' current weights, as NeMo RL's val_period measures it. The prompts are the
// environment's task indices grpo.validation_first_index .. + grpo.validation_prompts, which the
// rollouts never use (they take 0, 1, 2, ...); each is answered grpo.validation_samples times at
// grpo.validation_temperature (0: greedy), through the same agent loop and environment as
// training, and nothing of it is trained.
#include <cstdint>
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"
#include "loom/rl/controller/roles.h"

namespace loom::rl {

struct ValidationResult {
  int64_t weight_version = 0;  // the workers' weights it measured (learner steps trained)
  double reward_mean = 0.0;    // over every answered sample
  double reward_stderr = 0.0;  // the standard error of that mean (samples' std / sqrt(count))
  int64_t prompts = 0, samples = 0, truncated = 0;
  int64_t failed_prompts = 0;  // prompts whose episode failed after the retries (not counted)
  double seconds = 0.0;

  nlohmann::json to_json() const;
};

// Runs the held-out prompts on the workers (grpo.rollout_threads at once, or 2 per worker),
// retrying a failed episode grpo.episode_retries times on the next worker and environment.
// The weights must not change meanwhile (the controller calls it between refits).
ValidationResult validate(const config::RunConfig& config, Roles& roles, int64_t weight_version, std::ostream& log);

}  // namespace loom::rl
