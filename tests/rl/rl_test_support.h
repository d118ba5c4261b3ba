#pragma once
// Shared by the rl tests: an HTTP server of the test's own (an environment, a loom serve) run on
// a free port in a thread, stopped when the guard goes.
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace loom::rl::testing {

// `run(on_listening)` serves until `stop()`; the guard starts it and waits for its port.
class ServingThread {
 public:
  ServingThread(std::function<void(const std::function<void(int)>&)> run, std::function<void()> stop) : stop_(std::move(stop)) {
    thread_ = std::thread([this, run] { run([this](int port) { port_ = port; }); });
    for (int i = 0; i < 2000 && port_ == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_NE(port_.load(), 0) << "the server did not start listening";
  }
  ~ServingThread() {
    stop_();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_.load()); }

 private:
  std::function<void()> stop_;
  std::atomic<int> port_{0};
  std::thread thread_;
};

}  // namespace loom::rl::testing
