#pragma once
// AdamW on the device: the same update, element for element, as kernels::cpu::adamw_update
// (fp32 throughout, bias corrections computed once on the host), fused into one pass over the
// parameters, gradients and moments.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const kernels::AdamWStep& step, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
