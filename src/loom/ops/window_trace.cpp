#include "loom/ops/window_trace.h"

#include <utility>

#include "loom/core/error.h"

namespace loom::ops {

WindowTrace::WindowTrace(std::string dir, std::string prefix) : dir_(std::move(dir)), prefix_(std::move(prefix)) {}

void WindowTrace::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(!recording_, "a profile is already being recorded: stop it first");
  recording_ = true;
}

WindowTrace::Written WindowTrace::stop() {
  std::vector<TraceEvent> events;
  std::string path;
  int window = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(recording_, "no profile is being recorded: start one first");
    recording_ = false;
    events = log_.take();  // ranges still open end outside the window: dropped with it
    window = ++windows_;
    path = dir_ + "/" + prefix_ + "-" + std::to_string(window) + ".json";
  }
  Written written{path, 0};
  for (const TraceEvent& e : events) written.ranges += e.end_ns >= 0;
  write_chrome_trace(path, 0, prefix_, "engine", events, {{"window", window}});
  return written;
}

bool WindowTrace::started() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return recording_;
}

void WindowTrace::open(const char* name) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  log_.open(name, recording_);
}

void WindowTrace::close() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  log_.close();
}

}  // namespace loom::ops
