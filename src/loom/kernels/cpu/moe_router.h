#pragma once
// A mixture-of-experts router's backward on the CPU (kernels::moe_router_backward): the gradient of
// the logits, per token, from the scores recomputed as the router's forward computed them
// (kernels/router_scores.h).
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

// d_logits [tokens, E] written whole: the gradient of sum(row gradient . weight) and of the losses.
void moe_router_backward(float* d_logits, const RouterBackward& r);

}  // namespace loom::kernels::cpu
