#include "loom/ops/step_trace.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include "loom/core/atomic_file.h"
#include "loom/core/error.h"

namespace loom::ops {

StepTrace::StepTrace(StepTraceSettings settings)
    : settings_(std::move(settings)), origin_(std::chrono::steady_clock::now()) {
  LOOM_CHECK(settings_.first_step >= 1 && settings_.last_step >= settings_.first_step,
             "profiled steps " + std::to_string(settings_.first_step) + ".." + std::to_string(settings_.last_step) +
                 ": the first must be >= 1 and the last >= the first");
}

StepTrace::~StepTrace() { uninstall(); }

void StepTrace::install() {
  previous_ = trace::set_thread_sink(this);
  installed_on_ = std::this_thread::get_id();
}

void StepTrace::uninstall() {
  // Only the thread it was installed on holds it (a thread's sink is that thread's own).
  if (installed_on_ != std::this_thread::get_id()) return;
  trace::set_thread_sink(previous_);
  installed_on_ = {};
}

int64_t StepTrace::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
}

void StepTrace::begin_step(int64_t step) {
  if (step < settings_.first_step || step > settings_.last_step || written_) return;
  if (!recording_) {
    // What earlier steps queued is not the profiled steps' work.
    if (settings_.synchronize) settings_.synchronize();
    if (settings_.device_profiler) {
      settings_.device_profiler(true);
      profiler_started_ = true;
    }
    recording_ = true;
    install();
  }
  ++traced_steps_;
  last_traced_ = step;
}

std::string StepTrace::end_step(int64_t step) {
  if (step != settings_.last_step || !recording_) return "";
  return finish();
}

std::string StepTrace::end_run() {
  if (!recording_) return "";
  return finish();
}

std::string StepTrace::finish() {
  if (settings_.synchronize) settings_.synchronize();
  if (profiler_started_) settings_.device_profiler(false);
  profiler_started_ = false;
  recording_ = false;
  written_ = true;
  uninstall();
  write();
  return summary();
}

// Called only while installed, that is while recording.
void StepTrace::open(const char* name) {
  // The work issued before this range is not its work.
  if (settings_.synchronize) settings_.synchronize();
  open_.push_back(events_.size());
  events_.push_back({name, now_ns(), -1, static_cast<int>(open_.size()) - 1});
}

void StepTrace::close() {
  if (open_.empty()) return;  // an unbalanced close: nothing of ours to end
  const size_t event = open_.back();
  open_.pop_back();
  if (settings_.synchronize) settings_.synchronize();
  events_[event].end_ns = now_ns();
}

void StepTrace::write() const {
  const int pid = settings_.rank;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(pid)}}}});
  events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", 0},
                    {"args", {{"name", settings_.synchronize ? "training (device work, synchronized)"
                                                             : "training (host)"}}}});
  for (const Event& e : events_) {
    if (e.end_ns < 0) continue;  // still open when the recording ended (none in a well-nested step)
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", pid},
                      {"tid", 0},
                      {"ts", static_cast<double>(e.start_ns) / 1e3},
                      {"dur", static_cast<double>(e.end_ns - e.start_ns) / 1e3}});
  }
  const nlohmann::json trace = {
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       {{"rank", pid},
        {"first_step", settings_.first_step},
        {"last_step", last_traced_},
        {"synchronized", static_cast<bool>(settings_.synchronize)}}}};
  const std::filesystem::path path(settings_.path);
  std::error_code error;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), error);
  LOOM_CHECK(!error, "profile: cannot create " + path.parent_path().string() + ": " + error.message());
  const std::string text = trace.dump() + "\n";
  AtomicFileWriter writer(settings_.path);
  writer.write(text.data(), text.size());
  writer.commit();
}

std::string StepTrace::summary() const {
  const double steps = static_cast<double>(std::max<int64_t>(1, traced_steps_));
  double step_ns = 0.0;
  std::vector<std::string> order;
  std::map<std::string, double> phase_ns;
  for (const Event& e : events_) {
    if (e.end_ns < 0) continue;
    const double ns = static_cast<double>(e.end_ns - e.start_ns);
    if (e.depth == 0 && e.name.rfind("step ", 0) == 0) step_ns += ns;
    if (e.depth != 1) continue;
    if (phase_ns.find(e.name) == phase_ns.end()) order.push_back(e.name);
    phase_ns[e.name] += ns;
  }
  char line[160];
  std::snprintf(line, sizeof(line), "profile: rank %d, steps %lld-%lld%s: %.3f ms per step; trace in ", settings_.rank,
                static_cast<long long>(settings_.first_step), static_cast<long long>(last_traced_),
                settings_.synchronize ? " (device synchronized)" : "", step_ns / steps / 1e6);
  std::string text = line + settings_.path + "\n";
  for (const std::string& name : order) {
    const double ns = phase_ns[name];
    std::snprintf(line, sizeof(line), "  %-24s %10.3f ms %6.1f%%\n", name.c_str(), ns / steps / 1e6,
                  step_ns > 0.0 ? 100.0 * ns / step_ns : 0.0);
    text += line;
  }
  return text;
}

}  // namespace loom::ops
