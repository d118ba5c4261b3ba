#include "loom/ops/step_trace.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <utility>

#include "loom/core/error.h"
#include "loom/ops/chrome_trace.h"

namespace loom::ops {

StepTrace::StepTrace(StepTraceSettings settings) : settings_(std::move(settings)) {
  LOOM_CHECK(settings_.first_step >= 1 && settings_.last_step >= settings_.first_step,
             "profiled steps " + std::to_string(settings_.first_step) + ".." + std::to_string(settings_.last_step) +
                 ": the first must be >= 1 and the last >= the first");
}

StepTrace::~StepTrace() {
  uninstall();
  if (!profiler_started_) return;
  try {  // a run that failed inside its profiled steps: the profiler still stops
    settings_.device_profiler(false);
  } catch (...) {
  }
}

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

void StepTrace::begin_step(int64_t step) {
  if (step < settings_.first_step || step > settings_.last_step || written_) return;
  if (!recording_) {
    // What earlier steps queued is not the profiled steps' work.
    if (settings_.synchronize) settings_.synchronize();
    first_traced_ = step;
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
  synchronize();
  if (profiler_started_) settings_.device_profiler(false);
  profiler_started_ = false;
  recording_ = false;
  written_ = true;
  uninstall();
  write();
  return summary();
}

// Called only while installed, that is while recording. Neither throws: a range ends in a
// destructor, perhaps while an exception unwinds.
void StepTrace::open(const char* name) noexcept {
  synchronize();  // the work issued before this range is not its work
  log_.open(name, true);
}

void StepTrace::close() noexcept {
  synchronize();
  log_.close();
}

// The device's queued work waited for, where asked. Not while an exception unwinds (the device
// may wait on a peer that is gone), and not after the device failed once: the failure is the
// run's to report, at its next device call.
void StepTrace::synchronize() noexcept {
  if (!settings_.synchronize || device_failed_ || std::uncaught_exceptions() > 0) return;
  try {
    settings_.synchronize();
  } catch (...) {
    device_failed_ = true;
  }
}

void StepTrace::write() const {
  write_chrome_trace(settings_.path, settings_.rank, "rank " + std::to_string(settings_.rank),
                     settings_.synchronize ? "training (device work, synchronized)" : "training (host)", log_.events(),
                     {{"rank", settings_.rank},
                      {"first_step", first_traced_},
                      {"last_step", last_traced_},
                      {"synchronized", static_cast<bool>(settings_.synchronize)}});
}

std::string StepTrace::summary() const {
  const double steps = static_cast<double>(std::max<int64_t>(1, traced_steps_));
  double step_ns = 0.0;
  std::vector<std::string> order;
  std::map<std::string, double> phase_ns;
  auto is_step = [&](int64_t e) { return e >= 0 && log_.events()[static_cast<size_t>(e)].name.rfind("step ", 0) == 0; };
  for (size_t i = 0; i < log_.events().size(); ++i) {
    const TraceEvent& e = log_.events()[i];
    if (e.end_ns < 0) continue;
    const double ns = static_cast<double>(e.end_ns - e.start_ns);
    if (e.parent < 0 && is_step(static_cast<int64_t>(i))) step_ns += ns;
    if (!is_step(e.parent)) continue;  // a phase is a range directly inside a step's
    if (phase_ns.find(e.name) == phase_ns.end()) order.push_back(e.name);
    phase_ns[e.name] += ns;
  }
  char line[160];
  std::snprintf(line, sizeof(line), "profile: rank %d, steps %lld-%lld%s: %.3f ms per step; trace in ", settings_.rank,
                static_cast<long long>(first_traced_), static_cast<long long>(last_traced_),
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
