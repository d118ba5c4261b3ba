#pragma once
// A mixture-of-experts router on the CPU (kernels::moe_router_forward / moe_router_backward): its
// selections and combine weights from its logits, and the logits' gradient, per token, the scores
// computed once by each from the logits (kernels/router_scores.h): the same in both.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

// kernels::sigmoid_gate / sigmoid_gate_backward (a gated shared expert's gate).
void sigmoid_gate(float* gate, const double* logits, int64_t n);
void sigmoid_gate_backward(float* d_logit, const double* dots, const float* gate, int64_t n);
// The selections, combine weights and the losses' sums of RouterForward, token by token in order.
void moe_router_forward(const RouterForward& r);
// d_logits [tokens, E] written whole: the gradient of sum(row gradient . weight) and of the losses.
void moe_router_backward(float* d_logits, const RouterBackward& r);

}  // namespace loom::kernels::cpu
