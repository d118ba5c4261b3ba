#pragma once
// The per-step metrics of a GRPO run (run.dir/metrics.jsonl, one row per learner step): rewards
// per environment, generation and learner time, how long the learner waited, the staleness
// histogram, evicted groups, failures, restarts and tokens/s of each role (docs/grpo.md).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include <nlohmann/json.hpp>

#include "loom/rl/agent_loop.h"
#include "loom/rl/replay_buffer.h"

namespace loom::rl {

struct LearnerReport {
  double seconds = 0.0;                                     // from taking the batch to step_done
  nlohmann::json metrics = nlohmann::json::object();        // what the learner reported (loss, KL, ...)
};

class StepMetrics {
 public:
  // Rollout side, from any thread.
  void group_done(const GroupStats& stats);
  void episode_failed(FailedRole role);
  void group_dropped();
  // grpo.dynamic_sampling: a generated group whose samples were all rewarded alike, not kept.
  void group_filtered();

  // The row of `batch`'s step; counts since the previous row (generation tokens/s over the
  // wall time between the two rows).
  nlohmann::json row(const TakenBatch& batch, const LearnerReport& learner, int64_t evicted_total, int64_t restarts,
                     int64_t weight_version);

 private:
  std::mutex mutex_;
  int64_t generated_tokens_ = 0, groups_ = 0, tool_calls_ = 0;
  double group_seconds_ = 0.0;
  int64_t environment_failures_ = 0, generation_failures_ = 0, dropped_ = 0, filtered_ = 0;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
};

}  // namespace loom::rl
