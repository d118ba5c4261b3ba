#include "loom/ops/chrome_trace.h"

#include <filesystem>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ops {

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
