#pragma once
// 16-bit copies of fp32 arrays on the CPU (kernels::narrow_floats / widen_floats): bf16 gradients
// on the data-parallel wire, rounded to nearest even as loom::from_f32 rounds.
#include <cstdint>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::kernels::cpu {

// dst[i] = src[i] rounded to dtype (BF16 or F16).
void narrow_floats(void* dst, const float* src, int64_t n, DType dtype);
// dst[i] = f32(src[i]), or dst[i] += f32(src[i]) when accumulating.
void widen_floats(float* dst, const void* src, int64_t n, DType dtype, bool accumulate);
// n bf16 elements widened into a new fp32 array (the CPU forms of the bf16-tensor entries).
std::vector<float> widened_bf16(const void* src, int64_t n);

}  // namespace loom::kernels::cpu
