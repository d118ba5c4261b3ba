#pragma once
// Named ranges over a thread's work: the training step, its micro-batches, each block's forward
// and backward, the gradient reduction, the optimizer. Every range goes to NVTX (domain "loom",
// what Nsight Systems shows over the GPU's kernels; compiled in where the toolkit's nvtx3 headers
// are, a no-op call when no tool listens), and to the calling thread's sink when one is set (the
// profiled steps' trace, ops/step_trace.h). See docs/operations.md, "Profiling a run".
#include <cstdint>

namespace loom::trace {

// Receives the ranges of the thread that set it, innermost last. Neither call may throw: a
// range closes in a destructor, perhaps while an exception unwinds.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual void open(const char* name) noexcept = 0;
  virtual void close() noexcept = 0;
};

// The calling thread's sink (nullptr: none, the default); returns the one it replaces.
Sink* set_thread_sink(Sink* sink);

// One range, open from construction to destruction on the constructing thread. Its name is
// `what`, or "`what` `index`", or "`what` `index` `suffix`" ("block 3 forward"), at most 63
// characters (longer names are cut).
class Range {
 public:
  explicit Range(const char* what) : Range(what, -1, nullptr) {}
  Range(const char* what, int64_t index, const char* suffix = nullptr);
  ~Range() { end(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

  // Closes the range before its scope ends (the destructor then does nothing).
  void end();

 private:
  Sink* sink_;
  bool open_ = true;
};

}  // namespace loom::trace
