#pragma once
// A process-wide integer knob of the CUDA kernels (the FP8 casts' tile rows, the GEMM autotuning's
// candidates): a value set in code (not 0: a test or benchmark comparing the choices) wins, else
// the environment's, parsed once on first use. A parse that throws (a loom::Error naming the
// variable) throws again on the next use rather than leaving a value behind.
#include <atomic>
#include <mutex>

namespace loom::kernels::cuda {

class ProcessSetting {
 public:
  explicit ProcessSetting(int (*from_environment)()) : from_environment_(from_environment) {}
  int value() {
    const int set = set_.load(std::memory_order_relaxed);
    if (set != 0) return set;
    std::call_once(parsed_, [this] { environment_ = from_environment_(); });
    return environment_;
  }
  // 0: back to the environment's.
  void set(int value) { set_.store(value, std::memory_order_relaxed); }

 private:
  int (*from_environment_)();
  std::atomic<int> set_{0};
  std::once_flag parsed_;
  int environment_ = 0;
};

}  // namespace loom::kernels::cuda
