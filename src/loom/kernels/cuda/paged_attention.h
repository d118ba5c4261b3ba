#pragma once
// Attention over a paged KV cache on the device, with the contract of kernels::cpu's
// (cpu/paged_attention.h): every query row carries its sequence and position, GQA, causal up to
// the row's position. It follows the CPU's algorithm: scores, their maximum, the exponentials'
// sum, then the value rows weighted by exp(score - max) / sum in position order. One block per
// (row, head); keys in tiles of the block's threads (one key per thread, its slot looked up in
// the block table once per tile), the scores recomputed per pass rather than stored, so any
// sequence length fits. fp32 on CUDA cores. paged_cache_write stores rows' keys and values at
// their positions' slots. Block tables, sequences and positions live on the device.
// attention_decode (kernels::attention_decode's contract, cpu/attention.h) is the same kernel over
// one contiguous cache: new row r attends to positions 0 .. past + r.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void paged_attention(float* out, const float* q, int64_t q_stride, const float* k_pool, const float* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s, cudaStream_t stream = nullptr);
void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                      int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      cudaStream_t stream = nullptr);
void paged_cache_write(float* k_pool, float* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
