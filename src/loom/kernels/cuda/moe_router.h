#pragma once
// A mixture-of-experts router on the device (kernels::moe_router_forward / moe_router_backward), with
// the contracts of kernels/cpu/moe_router.h: one block per token, its scores computed from its
// logits, each sum in double as the CPU sums it (in another order: equal to within rounding).
#include <cuda_runtime.h>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// The forward: a block per token (its scores, its top k by k block-wide argmaxes, its weights and
// log-sum-exp), then the balancing loss's sums of each group's normalised scores over chunks of
// tokens and the chunks in order (deterministic).
void moe_router_forward(const RouterForward& r, cudaStream_t stream = nullptr);
void moe_router_backward(float* d_logits, const RouterBackward& r, cudaStream_t stream = nullptr);
// A gated shared expert's gate and its logits' gradient: a thread per row.
void sigmoid_gate(float* gate, const double* logits, int64_t n, cudaStream_t stream = nullptr);
void sigmoid_gate_backward(float* d_logit, const double* dots, const float* gate, int64_t n,
                           cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
