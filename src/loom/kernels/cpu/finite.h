#pragma once
// Whether a buffer holds an Inf or NaN (the precision step's check of the gradients).
#include <cstdint>

namespace loom::kernels::cpu {

// True when some x[i], i < n, has an all-ones exponent. OR is exact and order-free, so the
// threads' reduction is deterministic.
bool any_non_finite(const float* x, int64_t n);

}  // namespace loom::kernels::cpu
