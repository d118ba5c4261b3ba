#pragma once
// A window of named ranges (core/trace.h) opened on one thread, started and stopped from any
// other: `loom serve`'s /start_profile and /stop_profile over its engine thread's steps. Set as
// that thread's sink for its life; between start() and stop() its ranges are kept, and stop()
// writes them as a Chrome trace (chrome_trace.h). Ranges open across start() or stop() are left
// out. Thread-safe.
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "loom/core/trace.h"
#include "loom/ops/chrome_trace.h"

namespace loom::ops {

class WindowTrace : public trace::Sink {
 public:
  // Traces go to dir/<prefix>-<n>.json, n counting the windows from 1.
  WindowTrace(std::string dir, std::string prefix);

  // Starts a window; throws loom::Error when one is already open.
  void start();
  // Ends the window and writes its trace; returns the file and how many ranges it holds. Throws
  // loom::Error when none is open, or naming the file when it cannot be written.
  struct Written {
    std::string path;
    int64_t ranges = 0;
  };
  Written stop();
  bool started() const;

  void open(const char* name) noexcept override;
  void close() noexcept override;

 private:
  const std::string dir_, prefix_;
  mutable std::mutex mutex_;
  bool recording_ = false;
  int windows_ = 0;
  RangeLog log_;  // the engine thread's ranges, kept while a window is open
};

}  // namespace loom::ops
