#pragma once
// Named ranges written as a Chrome trace (the JSON that Perfetto and chrome://tracing open): one
// complete event ("X") per range, on one process row (`pid`) and thread row, written atomically.
// The profiled steps' trace (step_trace.h) and `loom serve`'s profile windows write theirs so.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::ops {

struct TraceEvent {
  std::string name;
  int64_t start_ns = 0, end_ns = -1;  // from the trace's origin; end -1: still open (left out)
  int64_t parent = -1;                // the event of the range open around it, or -1
};

// The ranges of one thread in the order they open and close, as trace events timed from the
// log's making. Ranges opened with keep = false are only nested over (no event). Neither call
// throws (out of memory: the range goes without an event).
class RangeLog {
 public:
  RangeLog();
  void open(const char* name, bool keep) noexcept;
  void close() noexcept;
  const std::vector<TraceEvent>& events() const { return events_; }
  // The events so far, handed over; the ranges open now keep no event.
  std::vector<TraceEvent> take();

 private:
  int64_t now_ns() const;

  std::chrono::steady_clock::time_point origin_;
  std::vector<TraceEvent> events_;
  std::vector<int64_t> open_;  // per open range: its event, or -1
};

// Writes `events` to `path` (its directory made), `other` as the trace's "otherData". Throws
// loom::Error naming the path when it cannot.
void write_chrome_trace(const std::string& path, int pid, const std::string& process_name,
                        const std::string& thread_name, const std::vector<TraceEvent>& events,
                        const nlohmann::json& other);

}  // namespace loom::ops
