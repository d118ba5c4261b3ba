#pragma once
// Softmax cross-entropy over logits split by vocabulary across ranks (Megatron's
// vocab-parallel cross-entropy): no rank holds a full row of logits. Three local passes with two
// small reductions over the group between them (the caller does them):
//   1. row_max        -> all-reduce Max          (the softmax's shift)
//   2. exp_sums       -> all-reduce Sum of [sum exp(z - max), target logit] per row
//   3. finish         -> losses, and the logits overwritten by their gradient (as the fused kernel)
#include <cstdint>

namespace loom::kernels::cpu {

// row_max[r] = max of this shard's logits of row r.
void vocab_shard_row_max(const float* logits, int64_t rows, int64_t vocab_shard, float* row_max);

// stats[2r] = sum of exp(z - row_max[r]) over this shard; stats[2r + 1] = the target's logit
// when this shard holds ids [first_id, first_id + vocab_shard) and the target among them, else 0.
void vocab_shard_exp_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, float* stats);

// With stats summed over the shards: losses[r] = log(sum) + max - target logit (0 for ignored
// rows); when grad_scale != 0 the shard's logits become grad_scale * (softmax - onehot).
// Returns the sum of losses over non-ignored rows.
double vocab_shard_finish(float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale);

// A per-token objective's gradient (model/token_objective.h): with stats summed over the shards,
// the shard's logits of row r become row_scale[r] * (softmax - onehot); ignored rows and rows
// whose scale is 0 get zero gradient. (Cross-entropy is the case row_scale[r] = grad_scale.)
void vocab_shard_gradient(float* logits, const float* row_max, const float* stats, const int32_t* targets,
                          int64_t rows, int64_t vocab_shard, int64_t first_id, const float* row_scale);

}  // namespace loom::kernels::cpu
