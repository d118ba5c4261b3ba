#include "loom/ops/chrome_trace.h"

#include <filesystem>
#include <utility>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ops {

RangeLog::RangeLog() : origin_(std::chrono::steady_clock::now()) {}

int64_t RangeLog::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
}

void RangeLog::open(const char* name, bool keep) noexcept {
  const int64_t parent = open_.empty() ? -1 : open_.back();
  int64_t event = -1;
  try {
    if (keep) {
      events_.push_back({name, now_ns(), -1, parent});
      event = static_cast<int64_t>(events_.size()) - 1;
    }
    open_.push_back(event);
  } catch (...) {
  }
}

void RangeLog::close() noexcept {
  if (open_.empty()) return;  // an unbalanced close: nothing to end
  const int64_t event = open_.back();
  open_.pop_back();
  if (event >= 0 && event < static_cast<int64_t>(events_.size())) events_[static_cast<size_t>(event)].end_ns = now_ns();
}

std::vector<TraceEvent> RangeLog::take() {
  for (int64_t& e : open_) e = -1;
  return std::exchange(events_, {});
}

void write_chrome_trace(const std::string& path, int pid, const std::string& process_name,
                        const std::string& thread_name, const std::vector<TraceEvent>& events,
                        const nlohmann::json& other) {
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", process_name}}}});
  list.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", thread_name}}}});
  for (const TraceEvent& e : events) {
    if (e.end_ns < 0) continue;
    list.push_back({{"name", e.name},
                    {"ph", "X"},
                    {"pid", pid},
                    {"tid", 0},
                    {"ts", static_cast<double>(e.start_ns) / 1e3},
                    {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3}});
  }
  const nlohmann::json trace = {{"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"}, {"otherData", other}};
  const std::filesystem::path file(path);
  std::error_code error;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), error);
  LOOM_CHECK(!error, "profile: cannot create " + file.parent_path().string() + ": " + error.message());
  const std::string text = trace.dump() + "\n";
  AtomicFileWriter writer(path);
  writer.write(text.data(), text.size());
  writer.commit();
}

}  // namespace loom::ops
