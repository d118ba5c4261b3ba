#include "loom/rl/replay_buffer.h"

#include <algorithm>
#include <chrono>

#include "loom/core/error.h"

namespace loom::rl {

ReplayBuffer::ReplayBuffer(int64_t max_staleness, int64_t prompts_per_step)
    : max_staleness_(max_staleness), prompts_per_step_(prompts_per_step) {
  LOOM_CHECK(max_staleness >= 0, "grpo.max_staleness must be >= 0, got " + std::to_string(max_staleness));
  LOOM_CHECK(prompts_per_step >= 1, "grpo.prompts_per_step must be >= 1, got " + std::to_string(prompts_per_step));
}

bool ReplayBuffer::try_reserve(int64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || version < next_step_ - max_staleness_) return false;  // would be evicted unused
  // A group of `version` can serve steps next_step .. version + k: at most prompts_per_step
  // groups for each of them, so none waits long enough to go stale.
  const int64_t steps_served = std::min(version + max_staleness_ - next_step_ + 1, max_staleness_ + 1);
  if (static_cast<int64_t>(groups_.size()) + reserved_ >= steps_served * prompts_per_step_) return false;
  ++reserved_;
  return true;
}

void ReplayBuffer::push(RolloutGroup group) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reserved_ = std::max<int64_t>(0, reserved_ - 1);
    groups_.push_back(std::move(group));
  }
  changed_.notify_all();
}

void ReplayBuffer::release() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reserved_ = std::max<int64_t>(0, reserved_ - 1);
  }
  changed_.notify_all();
}

int64_t ReplayBuffer::evict_locked(int64_t step) {
  const int64_t before = static_cast<int64_t>(groups_.size());
  std::erase_if(groups_, [&](const RolloutGroup& g) { return g.weight_version < step - max_staleness_; });
  const int64_t evicted = before - static_cast<int64_t>(groups_.size());
  evicted_ += evicted;
  return evicted;
}

int64_t ReplayBuffer::eligible_locked(int64_t step) const {
  return std::count_if(groups_.begin(), groups_.end(), [&](const RolloutGroup& g) { return g.weight_version >= step - max_staleness_; });
}

TakenBatch ReplayBuffer::take(int64_t step, int64_t count, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mutex_);
  TakenBatch batch;
  batch.step = step;
  next_step_ = std::max(next_step_, step);
  batch.evicted = evict_locked(step);
  changed_.notify_all();  // reservations for versions now too old are refused from here on
  batch.blocked = eligible_locked(step) < count;
  while (eligible_locked(step) < count) {
    LOOM_CHECK(!closed_, "replay buffer: closed while step " + std::to_string(step) + " waited for " + std::to_string(count) + " groups");
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && eligible_locked(step) < count)
      throw Error("replay buffer: step " + std::to_string(step) + " waited " + std::to_string(timeout_s) + " s for " +
                  std::to_string(count) + " groups of weight version >= " + std::to_string(step - max_staleness_) +
                  " (grpo.max_staleness " + std::to_string(max_staleness_) + "); " +
                  std::to_string(eligible_locked(step)) + " arrived (grpo.step_timeout_s)");
    batch.evicted += evict_locked(step);
  }
  // The oldest eligible groups first: they are the next to go stale.
  std::stable_sort(groups_.begin(), groups_.end(),
                   [](const RolloutGroup& a, const RolloutGroup& b) { return a.weight_version < b.weight_version; });
  for (auto it = groups_.begin(); it != groups_.end() && static_cast<int64_t>(batch.groups.size()) < count;) {
    if (it->weight_version >= step - max_staleness_) {
      ++batch.staleness[step - it->weight_version];
      batch.groups.push_back(std::move(*it));
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  next_step_ = step + 1;
  batch.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  lock.unlock();
  changed_.notify_all();
  return batch;
}

void ReplayBuffer::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
}

int64_t ReplayBuffer::stored() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(groups_.size());
}
int64_t ReplayBuffer::reserved() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reserved_;
}
int64_t ReplayBuffer::evicted_total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return evicted_;
}
int64_t ReplayBuffer::next_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_step_;
}

}  // namespace loom::rl
