#pragma once
// Attention over a paged KV cache on the device, with the contract of kernels::cpu's
// (cpu/paged_attention.h): every query row carries its sequence and position, GQA, causal up to
// the row's position. One block per (row, head) and one pass over the keys: each of its 4 warps
// takes every 4th key, the lanes across head_dim (each key's and value's row read whole,
// coalesced, its slot looked up in the block table), with an online softmax (running max, sum and
// weighted values, rescaled as the max grows), and the warps' results merged at the end; so any
// sequence length fits, head_dim up to 256. fp32 on CUDA cores (the sums in another order than the
// CPU's: within fp32 rounding of it); bf16 pools (s.cache) are widened as they are read and
// written rounded to nearest even, as the CPU's. paged_cache_write stores rows' keys and values at
// their positions' slots. Block tables, sequences and positions live on the device.
// attention_decode (kernels::attention_decode's contract, cpu/attention.h) is the same kernel over
// one contiguous cache: new row r attends to positions 0 .. past + r.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s, cudaStream_t stream = nullptr);
void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                      int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      cudaStream_t stream = nullptr);
void paged_cache_write(void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
