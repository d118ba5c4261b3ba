// The progress of a group's operations: the process's ticker and each group's communication
// thread, which runs queued operations while their callers compute (see group.h).
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

// ---------------------------------------------------------------------------------------------
// Ticker

namespace {

class Ticker {
 public:
  static Ticker& instance() {
    static auto* ticker = new Ticker();  // never destroyed: stop() ends the thread
    return *ticker;
  }
  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (running_) return;
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!running_) return;
      running_ = false;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  void add(std::weak_ptr<Group> group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(std::move(group));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (running_) {
      cv_.wait_for(lock, kTick);
      if (!running_) break;
      std::vector<std::shared_ptr<Group>> live;
      std::erase_if(groups_, [](const std::weak_ptr<Group>& weak) { return weak.expired(); });
      for (const auto& weak : groups_) {
        if (std::shared_ptr<Group> group = weak.lock()) live.push_back(std::move(group));
      }
      lock.unlock();
      const auto now = Clock::now();
      for (const auto& group : live) group->tick(now);
      live.clear();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool running_ = false;
  std::thread thread_;
  std::vector<std::weak_ptr<Group>> groups_;
};

}  // namespace

void start_ticker() { Ticker::instance().start(); }
void stop_ticker() { Ticker::instance().stop(); }
bool ticker_running() { return Ticker::instance().running(); }
void watch_group(std::weak_ptr<Group> group) { Ticker::instance().add(std::move(group)); }

// ---------------------------------------------------------------------------------------------
// Communication thread

void Group::start_worker_locked() {
  if (worker_.joinable() || shutdown_) return;
  // The thread holds the group: a thread left blocked in MPI (see close()) must not outlive it.
  worker_ = std::thread([self = shared_from_this()] { self->worker_loop(); });
}

void Group::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    worker_idle_ = true;
    work_cv_.wait(lock, [&] { return shutdown_.load() || (!executing_ && !queue_.empty()); });
    worker_idle_ = false;
    if (shutdown_) break;
    // A caller that waits right after issuing (every blocking collective) runs the operation
    // itself; give it the moment to claim it, so that it need not sleep while this thread runs
    // it. (Without the handshake a caller never runs it: see wait().)
    const auto claimable = queue_.front()->issued + kClaimGrace;
    if (queue_.front()->check_agreement && Clock::now() < claimable) {
      lock.unlock();
      std::this_thread::sleep_until(claimable);
      lock.lock();
      if (shutdown_) break;
      if (executing_ || queue_.empty()) continue;
    }
    auto op = claim_locked();
    lock.unlock();
    execute(op, std::nullopt);
    lock.lock();
    release_locked();
  }
  worker_exited_ = true;
  done_cv_.notify_all();
}

std::shared_ptr<CollectiveOp> Group::claim_locked() {
  auto op = queue_.front();
  queue_.pop_front();
  executing_ = true;
  running_ = op;
  return op;
}

void Group::release_locked() {
  executing_ = false;
  running_.reset();
  wake_worker_locked();
  wake_waiters_locked();
}

void Group::wake_worker_locked() {
  if (worker_idle_ && !executing_ && !queue_.empty()) work_cv_.notify_one();
}

void Group::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shutdown_ || executing_ || queue_.empty() || !worker_idle_) return;
  if (now - queue_.front()->issued < kPark) return;
  // Its caller went on without waiting: the group is used asynchronously.
  eager_wake_ = true;
  work_cv_.notify_one();
}

void Group::wake_waiters_locked() {
  if (waiters_ > 0) done_cv_.notify_all();
}

}  // namespace loom::comm::mpi_detail
