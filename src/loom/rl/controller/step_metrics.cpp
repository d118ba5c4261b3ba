#include "loom/rl/controller/step_metrics.h"

#include <algorithm>
#include <limits>
#include <map>

namespace loom::rl {

using nlohmann::json;

void StepMetrics::group_done(const GroupStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  generated_tokens_ += stats.generated_tokens;
  tool_calls_ += stats.tool_calls;
  group_seconds_ += stats.seconds;
  ++groups_;
}

void StepMetrics::episode_failed(FailedRole role) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++(role == FailedRole::Environment ? environment_failures_ : generation_failures_);
}

void StepMetrics::group_dropped() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++dropped_;
}

void StepMetrics::group_filtered() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++filtered_;
}

json StepMetrics::row(const TakenBatch& batch, const LearnerReport& learner, int64_t evicted_total, int64_t restarts,
                      int64_t weight_version) {
  struct Range {
    double sum = 0.0, min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
    int64_t count = 0;
  };
  std::map<std::string, Range> rewards;
  Range all;
  int64_t trained_tokens = 0, truncated = 0;
  for (const RolloutGroup& g : batch.groups) {
    for (const Rollout& r : g.samples) {
      for (Range* range : {&rewards[r.environment], &all}) {
        range->sum += r.reward;
        range->min = std::min(range->min, r.reward);
        range->max = std::max(range->max, r.reward);
        ++range->count;
      }
      for (uint8_t t : r.trained) trained_tokens += t;
      truncated += r.truncated ? 1 : 0;
    }
  }
  auto summary = [](const Range& r) {
    return r.count == 0 ? json{{"mean", nullptr}, {"min", nullptr}, {"max", nullptr}}
                        : json{{"mean", r.sum / static_cast<double>(r.count)}, {"min", r.min}, {"max", r.max}};
  };
  json per_environment = json::object();
  for (const auto& [name, range] : rewards) {
    per_environment[name] = summary(range);
    per_environment[name]["samples"] = range.count;
  }
  json staleness = json::object();
  for (const auto& [age, count] : batch.staleness) staleness[std::to_string(age)] = count;

  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  const double window = std::chrono::duration<double>(now - since_).count();
  const json s = summary(all);
  json row = {{"step", batch.step},
              {"reward_mean", s["mean"]},
              {"reward_min", s["min"]},
              {"reward_max", s["max"]},
              {"reward", per_environment},
              {"groups", batch.groups.size()},
              {"samples", all.count},
              {"truncated", truncated},
              {"learner_wait_s", batch.waited_s},
              {"learner_s", learner.seconds},
              {"learner_tokens_per_s", learner.seconds > 0 ? static_cast<double>(trained_tokens) / learner.seconds : 0.0},
              {"trained_tokens", trained_tokens},
              {"staleness", staleness},
              {"evicted", batch.evicted},
              {"evicted_total", evicted_total},
              {"generation_s", window},
              {"generation_group_s", groups_ > 0 ? group_seconds_ / static_cast<double>(groups_) : 0.0},
              {"generated_groups", groups_},
              {"generated_tokens", generated_tokens_},
              {"generation_tokens_per_s", window > 0 ? static_cast<double>(generated_tokens_) / window : 0.0},
              {"tool_calls", tool_calls_},
              {"environment_failures", environment_failures_},
              {"generation_failures", generation_failures_},
              {"dropped_groups", dropped_},
              {"filtered_groups", filtered_},
              {"role_restarts", restarts},
              {"weight_version", weight_version},
              {"learner", learner.metrics}};
  generated_tokens_ = groups_ = tool_calls_ = 0;
  group_seconds_ = 0.0;
  environment_failures_ = generation_failures_ = dropped_ = filtered_ = 0;
  since_ = now;
  return row;
}

}  // namespace loom::rl
