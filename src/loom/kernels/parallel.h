#pragma once
// When a loop's work is too small, the fork/join of an OpenMP region costs more than it saves
// (and with busy cores, far more): host loops pass `if(worth_parallel(work))` to their regions.
#include <cstdint>

namespace loom::kernels {

constexpr int64_t kMinParallelWork = 32768;  // elements touched
inline bool worth_parallel(int64_t work) { return work >= kMinParallelWork; }

}  // namespace loom::kernels
