#pragma once
// Softmax cross-entropy on the device, fused with its backward, with the contracts of
// kernels::cpu (cross_entropy.h, vocab_parallel_cross_entropy.h): logits [rows, vocab] are
// overwritten with grad_scale * (softmax - onehot(target)) unless grad_scale is 0; losses[r] is
// the row's loss (0 for kIgnoreIndex, whose gradient row is zeroed); the return value is the sum
// of the losses, accumulated in double in a fixed order (deterministic). A target outside
// [0, vocab) throws loom::Error naming it before any logit is touched. The vocabulary-parallel
// pieces (row_max -> all-reduce max -> exp_sums -> all-reduce sum -> finish) keep their CPU
// contracts too. The fused kernel: a block of 1024 threads per row, the max and the sum of
// exponentials in one online pass, then the gradient pass over the row still in L2; expf where the
// CPU uses its polynomial exp (within 2e-7), so results agree to fp32 rounding. These calls wait for the stream (they return a host sum).
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

double softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                             float grad_scale, cudaStream_t stream = nullptr);
// The same over bf16 logits (the head's bf16 output), replaced by the gradient rounded to bf16
// (nearest even): the fp32 arithmetic of softmax_cross_entropy, so round() of its gradient.
double softmax_cross_entropy_bf16(void* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                                  float grad_scale, cudaStream_t stream = nullptr);
void vocab_shard_row_max(const float* logits, int64_t rows, int64_t vocab_shard, float* row_max,
                         cudaStream_t stream = nullptr);
void vocab_shard_exp_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, float* stats, cudaStream_t stream = nullptr);
double vocab_shard_finish(float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale, cudaStream_t stream = nullptr);
// A per-token objective's gradient: logits[r] = row_scale[r] (softmax_r - onehot(target_r)) over
// the shard (zero for an ignored target or a zero scale), from the rows' max and exp sums.
void vocab_shard_gradient(float* logits, const float* row_max, const float* stats, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, const float* row_scale, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
