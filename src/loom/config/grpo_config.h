#pragma once
// The `grpo` section (`loom grpo`, docs/grpo.md): how rollouts are generated (environment,
// group size, turns, sampling), how many groups a learner step takes, the staleness bound, and
// how the controller treats failures and weight updates. The learner's own settings are the
// trainer's (`train`, `optim`, `parallel`, ...).
#include <cstdint>
#include <string>

namespace loom::config {

struct GrpoConfig {
  // Rollouts.
  std::string environment = "countdown";  // arithmetic | countdown | calculator (loom env serve --task)
  int task_digits = 2;                    // arithmetic, calculator: operands of up to this many digits
  int task_numbers = 4;                   // countdown: how many numbers are given
  int samples_per_prompt = 4;             // n: the size of a group
  int prompts_per_step = 8;               // groups one learner step trains on (the global batch)
  int max_turns = 1;                      // model turns per episode (tool calls in between)
  int max_tokens = 32;                    // sampled tokens per model turn
  double temperature = 1.0;
  double top_p = 1.0;
  // Roles.
  int generation_workers = 1;             // `loom serve` processes
  int environment_servers = 1;            // `loom env serve` processes
  int worker_kv_cache_mb = 64;            // each worker's --kv-cache-mb
  int rollout_threads = 0;                // groups generated at once; 0: 2 per generation worker
  // Staleness and weight updates.
  int max_staleness = 1;                  // step s trains on groups of weight version >= s - k; 0: synchronous
  std::string inflight_updates = "continue";  // continue: running requests go on with the new weights; wait: they finish first
  // Failures.
  std::string episode_failure = "retry";  // retry | drop: an episode whose environment or worker failed
  int episode_retries = 3;                // retries of one group before it is dropped
  double generation_timeout_s = 300.0;    // one chat request
  double environment_timeout_s = 30.0;    // one environment request
  double step_timeout_s = 1800.0;         // the learner waiting for one step's groups
  int max_role_restarts = 10;             // restarts of one environment server or worker before the run fails
};

}  // namespace loom::config
