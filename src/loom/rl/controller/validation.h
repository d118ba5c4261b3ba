#pragma once
// Validation of a GRPO run (docs/grpo.md, "Validation"): the mean reward of held-out prompts under
// the workers' current weights, as NeMo RL's val_period measures it, over all the run's
// environments and per environment. The prompts are each environment's task indices
// grpo.validation_first_index .. + grpo.validation_prompts, which the rollouts never use (they
// take 0, 1, 2, ...); each is answered grpo.validation_samples times at
// grpo.validation_temperature (0: greedy), through the same agent loop and environments as
// training, and nothing of it is trained.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"
#include "loom/rl/controller/roles.h"
#include "loom/rl/rollout.h"

namespace loom::rl {

// The rewards of some held-out prompts' samples.
struct ValidationRewards {
  double reward_mean = 0.0;    // over every answered sample
  double reward_stderr = 0.0;  // the standard error of that mean (samples' std / sqrt(count))
  int64_t prompts = 0, samples = 0, truncated = 0;
  int64_t failed_prompts = 0;  // prompts whose episode failed after the retries (not counted)

  void add_prompt(const std::vector<Rollout>& samples);  // empty: a failed prompt
  void add(const ValidationRewards& other);
  void finish();  // the mean and standard error from the sums
  nlohmann::json to_json() const;

 private:
  double sum_ = 0.0, sum_squares_ = 0.0;
};

struct ValidationResult {
  int64_t weight_version = 0;  // the workers' weights it measured (learner steps trained)
  ValidationRewards all;       // every environment's prompts
  std::vector<std::pair<std::string, ValidationRewards>> environments;  // per environment, by name
  double seconds = 0.0;

  // all's keys, "environments": {name: {its keys}}, "weight_version", "seconds".
  nlohmann::json to_json() const;
};

// Runs the held-out prompts on the workers (grpo.rollout_threads at once, or 2 per worker),
// retrying a failed episode grpo.episode_retries times on the next worker and environment server.
// The weights must not change meanwhile (the controller calls it between refits).
ValidationResult validate(const config::RunConfig& config, Roles& roles, int64_t weight_version, std::ostream& log);

}  // namespace loom::rl
