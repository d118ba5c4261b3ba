#pragma once
// The running amax of the FP8 recipes' operands.
#include <cstdint>

namespace loom::kernels::cpu {

// *dst = max(*dst, max |x_i|), a NaN anywhere (or in *dst) giving NaN and an Inf, Inf: what
// precision::amax gives for a finite x, whatever the split (max is exact).
void amax_into(float* dst, const float* x, int64_t n);
// The same over a bf16 tensor (2-byte elements), widened exactly.
void amax_into_bf16(float* dst, const void* x16, int64_t n);

}  // namespace loom::kernels::cpu
