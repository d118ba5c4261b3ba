#pragma once
// A mixture-of-experts router's backward on the device (kernels::moe_router_backward), with the
// contract of kernels/cpu/moe_router.h: one block per token, its scores recomputed from its logits,
// each sum in double as the CPU sums it (in another order: equal to within rounding).
#include <cuda_runtime.h>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void moe_router_backward(float* d_logits, const RouterBackward& r, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
