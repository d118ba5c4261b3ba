#pragma once
// A thread that watches operations nobody waits for on the host, so that a timeout still holds
// for them: an NCCL operation whose result the compute stream waits for (Work::wait_in_stream)
// lets the host run ahead, and only this thread sees it hang. Each watch is polled every interval
// until it reports done (then dropped), reports a failure, or outlives its timeout; both failures
// go to the handler with a message naming the operation. The thread starts with the first watch
// and stops with the watchdog; with nothing to watch it sleeps.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::comm {

class Watchdog {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State { Pending, Done, Failed };
  struct Poll {
    State state = State::Pending;
    std::string why;  // for Failed: what went wrong
  };
  using Poller = std::function<Poll()>;
  using FailureHandler = std::function<void(const std::string& message)>;

  Watchdog(FailureHandler on_failure, std::chrono::microseconds interval);
  ~Watchdog();  // stops and joins the thread; watches still pending are dropped unreported
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Watches `what` until poll() is Done, Failed (on_failure("<what>: <why>")) or `timeout` has
  // passed since this call (on_failure("<what> timed out after <timeout> ms (...)")). poll runs on
  // the watchdog's thread and must not throw.
  void watch(std::string what, std::chrono::milliseconds timeout, Poller poll);
  // Watches not yet done or reported.
  size_t watching() const;

 private:
  struct Watch {
    std::string what;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
    Poller poll;
  };
  void run();

  FailureHandler on_failure_;
  std::chrono::microseconds interval_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Watch> watches_;
  size_t polling_ = 0;  // taken out of watches_ for the round in progress
  bool stop_ = false;
  std::thread thread_;  // started by the first watch
};

}  // namespace loom::comm
