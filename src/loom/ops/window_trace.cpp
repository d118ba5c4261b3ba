#include "loom/ops/window_trace.h"

#include <utility>

#include "loom/core/error.h"

namespace loom::ops {

WindowTrace::WindowTrace(std::string dir, std::string prefix)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), origin_(std::chrono::steady_clock::now()) {}

int64_t WindowTrace::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
}

void WindowTrace::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  LOOM_CHECK(!recording_, "a profile is already being recorded: stop it first");
  recording_ = true;
  events_.clear();
}

WindowTrace::Written WindowTrace::stop() {
  std::vector<TraceEvent> events;
  std::string path;
  int window = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(recording_, "no profile is being recorded: start one first");
    recording_ = false;
    events.swap(events_);
    // Ranges still open end outside the window: their events are dropped with it.
    for (int64_t& e : open_) e = -1;
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
  const int64_t parent = open_.empty() ? -1 : open_.back();
  int64_t event = -1;
  try {  // out of memory: the window goes without this range
    if (recording_) {
      events_.push_back({name, now_ns(), -1, parent});
      event = static_cast<int64_t>(events_.size()) - 1;
    }
    open_.push_back(event);
  } catch (...) {
  }
}

void WindowTrace::close() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_.empty()) return;
  const int64_t event = open_.back();
  open_.pop_back();
  if (event >= 0 && event < static_cast<int64_t>(events_.size())) events_[static_cast<size_t>(event)].end_ns = now_ns();
}

}  // namespace loom::ops
