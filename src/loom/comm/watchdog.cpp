#include "loom/comm/watchdog.h"

#include <utility>

namespace loom::comm {

Watchdog::Watchdog(FailureHandler on_failure, std::chrono::microseconds interval)
    : on_failure_(std::move(on_failure)), interval_(interval) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch(std::string what, std::chrono::milliseconds timeout, Poller poll) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watches_.push_back({std::move(what), Clock::now() + timeout, timeout, std::move(poll)});
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  wake_.notify_all();
}

size_t Watchdog::watching() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watches_.size() + polling_;
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !watches_.empty(); });
    if (stop_) return;
    // Polled without the lock, so watch() never waits for a round; what it adds meanwhile joins
    // the next one.
    std::vector<Watch> round = std::move(watches_);
    watches_.clear();
    polling_ = round.size();
    lock.unlock();
    std::vector<Watch> pending;
    std::vector<std::string> failures;
    const Clock::time_point now = Clock::now();
    for (Watch& w : round) {
      const Poll p = w.poll();
      if (p.state == State::Done) continue;
      if (p.state == State::Failed) {
        failures.push_back(w.what + ": " + p.why);
      } else if (now > w.deadline) {
        failures.push_back(w.what + " timed out after " + std::to_string(w.timeout.count()) +
                           " ms (some rank did not issue it, or the device work before it never ended)");
      } else {
        pending.push_back(std::move(w));
      }
    }
    round.clear();  // what a finished watch held (a poller's last reference) goes without the lock
    lock.lock();
    polling_ = 0;
    watches_.insert(watches_.begin(), std::make_move_iterator(pending.begin()), std::make_move_iterator(pending.end()));
    // Reported once the watches stand as they will for the next round (a handler may look at
    // them, or end the process), and without the lock (it may add a watch).
    if (!failures.empty()) {
      lock.unlock();
      for (const std::string& message : failures) on_failure_(message);
      lock.lock();
    }
    if (stop_) return;
    if (!watches_.empty()) wake_.wait_for(lock, interval_, [&] { return stop_; });
  }
}

}  // namespace loom::comm
