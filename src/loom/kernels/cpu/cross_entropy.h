#pragma once
// Softmax cross-entropy over logits, fused with its backward as in llm.c: the logits buffer is
// overwritten by d(loss)/d(logits) so the [rows, vocab] tensor exists only once.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

using kernels::kIgnoreIndex;  // targets equal to this are masked out (no loss, no gradient)

// losses[r] = logsumexp(logits[r]) - logits[r, targets[r]] (0 for ignored rows).
// When grad_scale != 0, logits[r] is replaced by grad_scale * (softmax(logits[r]) - onehot);
// ignored rows get zero gradient. Returns the sum of losses over non-ignored rows (in double).
double softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t rows,
                             int64_t vocab, float grad_scale);
// The same over bf16 logits (2-byte elements), replaced by the gradient rounded to bf16 (nearest
// even): computed in fp32 as above, so the gradient is round() of that one's.
double softmax_cross_entropy_bf16(void* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                                  float grad_scale);

}  // namespace loom::kernels::cpu
