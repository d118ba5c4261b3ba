#pragma once
// The precision layer's arrays run on every GEMM operand, from tiny (a test, one head) to large:
// OpenMP regions only pay off past the same work threshold the CPU kernels use
// (kernels/cpu/parallel.h; repeated here because precision does not link kernels).
#include <cstdint>

namespace loom::precision {

constexpr int64_t kMinParallelElements = 32768;
inline bool worth_parallel(int64_t elements) { return elements >= kMinParallelElements; }

}  // namespace loom::precision
