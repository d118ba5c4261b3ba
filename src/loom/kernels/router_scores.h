#pragma once
// A mixture-of-experts router's scores of one token's row of logits, on the host (model/moe_router.h
// decides its routing there) and in the CPU's backward kernel (kernels/cpu/moe_router.h), which
// recomputes them: one definition, so the backward's scores are the forward's bit for bit.
#include "loom/kernels/types.h"

namespace loom::kernels {

// The softmax of n values: exp in float from the row's max, the sum in double.
void softmax_row(const float* logits, float* out, int n);
// out[e] = softmax(logits)[e] (softmax_row), or the sigmoid of each logit, for e < n.
void router_scores(RouterKind kind, const float* logits, float* out, int n);
// log(sum_e exp(logits[e])) in double, from the row's max.
double log_sum_exp(const float* logits, int n);

}  // namespace loom::kernels
