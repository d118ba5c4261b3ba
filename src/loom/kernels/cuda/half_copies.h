#pragma once
// 16-bit copies of fp32 arrays on a GPU (kernels::narrow_floats / widen_floats): bf16 gradients on
// the data-parallel wire. Rounding is to nearest even, as loom::from_f32 on the CPU. Device memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/core/dtype.h"

namespace loom::kernels::cuda {

// dst[i] = src[i] rounded to dtype (BF16 or F16).
void narrow_floats(void* dst, const float* src, int64_t n, DType dtype, cudaStream_t stream = nullptr);
// dst[i] = f32(src[i]), or dst[i] += f32(src[i]) when accumulating.
void widen_floats(float* dst, const void* src, int64_t n, DType dtype, bool accumulate, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
