#include "loom/train/batch_schedule.h"

#include <algorithm>
#include <limits>

namespace loom::train {

namespace {

using Wide = __int128;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// The ramp-up's stages: stage k < n trains on start + k x increment and holds the step starts c
// with floor(c n / samples) = k; stage n (c >= samples) trains on train.global_batch.
struct Stages {
  const config::TrainConfig& train;

  int64_t count() const {
    const config::BatchRampup& r = train.rampup_batch_size;
    return r.on() ? (train.global_batch - r.start) / r.increment : 0;
  }
  int64_t of(int64_t consumed) const {
    const int64_t n = count();
    if (n == 0 || consumed >= train.rampup_batch_size.samples) return n;
    return static_cast<int64_t>(static_cast<Wide>(consumed) * n / train.rampup_batch_size.samples);
  }
  int64_t batch(int64_t stage) const {
    const int64_t n = count();
    if (stage >= n) return train.global_batch;
    return train.rampup_batch_size.start + stage * train.rampup_batch_size.increment;
  }
  // The first step start past stage k < n: ceil((k + 1) samples / n).
  int64_t end(int64_t stage) const {
    const int64_t n = count();
    if (stage >= n) return kNoLimit;
    const Wide top = static_cast<Wide>(stage + 1) * train.rampup_batch_size.samples;
    return static_cast<int64_t>((top + n - 1) / n);
  }
};

struct Walk {
  int64_t steps = 0, consumed = 0;
};

// Takes steps from `at` while a step starts before `end` samples and fewer than `max_steps` have
// been taken, a stage at a time.
Walk walk(const config::TrainConfig& train, Walk at, int64_t end, int64_t max_steps) {
  const Stages stages{train};
  while (at.consumed < end && at.steps < max_steps) {
    const int64_t stage = stages.of(at.consumed);
    const int64_t batch = stages.batch(stage);
    const int64_t limit = std::min(stages.end(stage), end);
    const Wide needed = (static_cast<Wide>(limit) - at.consumed + batch - 1) / batch;
    const int64_t taken = static_cast<int64_t>(std::min<Wide>(needed, max_steps - at.steps));
    at.steps += taken;
    at.consumed += taken * batch;
  }
  return at;
}

}  // namespace

int64_t global_batch_at(const config::TrainConfig& train, int64_t consumed) {
  const Stages stages{train};
  return stages.batch(stages.of(consumed));
}

int64_t training_steps(const config::TrainConfig& train) {
  if (train.samples == 0) return train.steps;
  if (!train.rampup_batch_size.on()) return train.samples / train.global_batch;
  const int64_t last_start = std::min(train.rampup_batch_size.samples, train.samples);
  Walk ramp = walk(train, {}, last_start + 1, kNoLimit);
  if (train.samples > ramp.consumed) ramp.steps += (train.samples - ramp.consumed) / train.global_batch;
  return ramp.steps;
}

int64_t samples_after_steps(const config::TrainConfig& train, int64_t steps) {
  return walk(train, {}, kNoLimit, steps).consumed;
}

int64_t rampup_steps(const config::TrainConfig& train) {
  if (!train.rampup_batch_size.on()) return 0;
  return walk(train, {}, train.rampup_batch_size.samples, kNoLimit).steps;
}

std::vector<BatchSteps> steps_by_batch(const config::TrainConfig& train) {
  const int64_t total = training_steps(train);
  const Stages stages{train};
  std::vector<BatchSteps> groups;
  Walk at;
  while (at.steps < total) {
    const int64_t stage = stages.of(at.consumed);
    const Walk next = walk(train, at, stages.end(stage), total);  // the steps that start in this stage
    const int64_t batch = stages.batch(stage), steps = next.steps - at.steps;
    if (!groups.empty() && groups.back().batch == batch) {
      groups.back().steps += steps;
    } else {
      groups.push_back({batch, steps});
    }
    at = next;
  }
  return groups;
}

std::string run_length_key(const config::TrainConfig& train) {
  if (train.samples == 0) return "train.steps = " + std::to_string(train.steps);
  return "train.samples = " + std::to_string(train.samples) + " (" + std::to_string(training_steps(train)) + " steps)";
}

std::string describe_batches(const config::TrainConfig& train) {
  const config::BatchRampup& r = train.rampup_batch_size;
  if (!r.on()) return "";
  const int64_t steps = rampup_steps(train);
  return "batch: ramps up from " + std::to_string(r.start) + " to " + std::to_string(train.global_batch) +
         " sequences by " + std::to_string(r.increment) + " over the first " + std::to_string(r.samples) +
         " samples (" + (steps == 1 ? "step 1" : "steps 1-" + std::to_string(steps)) + "), then " +
         std::to_string(train.global_batch) + "\n";
}

}  // namespace loom::train
