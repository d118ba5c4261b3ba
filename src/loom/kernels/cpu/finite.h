#pragma once
// Whether a buffer holds an Inf or NaN (the precision step's check of the gradients), and the
// running amax of the FP8 recipes' operands.
#include <cstdint>

namespace loom::kernels::cpu {

// True when some x[i], i < n, has an all-ones exponent. OR is exact and order-free, so the
// threads' reduction is deterministic.
bool any_non_finite(const float* x, int64_t n);

// *dst = max(*dst, max |x_i|), a NaN anywhere (or in *dst) giving NaN and an Inf, Inf: what
// precision::amax gives for a finite x, whatever the split (max is exact).
void amax_into(float* dst, const float* x, int64_t n);
// The same over a bf16 tensor (2-byte elements), widened exactly.
void amax_into_bf16(float* dst, const void* x16, int64_t n);

}  // namespace loom::kernels::cpu
