#pragma once
// The profiled steps of one rank (profile.*, docs/operations.md "Profiling a run"): every named
// range (core/trace.h) its training thread opens from the start of the first profiled step to
// the end of the last, written as a Chrome trace (Perfetto, chrome://tracing) and summed by
// phase. On a GPU the device's work is waited for at each range's ends when asked, so a range
// times the work it issued rather than the issuing; the device's profiler (cudaProfilerStart /
// Stop, Nsight Systems' --capture-range=cudaProfilerApi) brackets the profiled steps.
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "loom/core/trace.h"
#include "loom/ops/chrome_trace.h"

namespace loom::ops {

struct StepTraceSettings {
  int64_t first_step = 1, last_step = 1;  // inclusive
  int rank = 0;
  std::string path;                       // the trace file, written atomically
  std::function<void()> synchronize;      // waits for the device's queued work; empty: none
  std::function<void(bool start)> device_profiler;  // starts / stops the device's profiler; empty: none
};

// The trace sink of the thread that steps (begin_step .. end_step), from the first profiled step
// until the trace is written.
class StepTrace : public trace::Sink {
 public:
  explicit StepTrace(StepTraceSettings settings);
  ~StepTrace() override;
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  // Around each step, outside its ranges. After the last profiled step end_step writes the trace
  // and returns the summary (what summary() gives); otherwise it returns "".
  void begin_step(int64_t step);
  std::string end_step(int64_t step);
  // Where the run ends before the last profiled step: the steps traced so far, written as
  // end_step would (their summary), or "" when none was traced or they were written already.
  std::string end_run();

  void open(const char* name) noexcept override;
  void close() noexcept override;

  // The steps traced and their mean time, then the phases (ranges directly inside a step's: not
  // an evaluation's between steps) by name, in first-seen order, with their mean time per step
  // and share of the step. A few lines of text.
  std::string summary() const;
  const std::string& path() const { return settings_.path; }

 private:
  std::string finish();
  void synchronize() noexcept;
  void write() const;
  void install();
  void uninstall();

  StepTraceSettings settings_;
  trace::Sink* previous_ = nullptr;  // the thread's sink before this one was installed
  std::thread::id installed_on_;     // default: not installed
  bool recording_ = false, profiler_started_ = false, written_ = false, device_failed_ = false;
  int64_t traced_steps_ = 0, first_traced_ = 0, last_traced_ = 0;
  RangeLog log_;  // the profiled steps' ranges
};

}  // namespace loom::ops
