#pragma once
// Attention over a paged KV cache on the device, with the contract of kernels::cpu's
// (cpu/paged_attention.h): every query row carries its sequence and position, GQA, causal up to
// the row's position; head_dim up to 256. Split over the keys (flash-decoding): a row's keys go in
// partitions of kPagedPartitionKeys, a block per (row, kv head, up to 8 of its query heads,
// partition), so a few long sequences still fill the GPU; each key's and value's row is read once
// for all the query heads of its GQA group. In a block each of 4 warps takes runs of consecutive
// keys (4 rows' loads in flight per lane up to head_dim 64, 2 up to 128, 1 above), its lanes
// across head_dim (rows read whole, coalesced, two adjacent columns per lane and load where
// head_dim is even; slots looked up in the block table), the run's
// dot products of all the block's heads summed over the lanes together (2V + 4 - log2 V shuffles
// for V of them, not 5V), with an online softmax per head; the warps' results are merged in
// shared memory. Kernels are built per heads per block (1, 2, 4, 8) and head_dim class. A row
// longer than one partition leaves each partition's max, sum and weighted values, which a second
// kernel merges in partition order.
// Every sum's order depends on the row's length only, so a row's result is the same bits in any
// batch (the engine's batch invariance). fp32 on CUDA cores, the sums in another order than the
// CPU's (within fp32 rounding of it); bf16 pools (s.cache) are widened as they are read and
// written rounded to nearest even, as the CPU's. paged_cache_write stores rows' keys and values at
// their positions' slots. Block tables, sequences and positions live on the device; the number of
// partitions comes from the tables' width (the longest table of the batch, whole blocks).
// attention_decode (kernels::attention_decode's contract, cpu/attention.h) is the same kernel over
// one contiguous cache: new row r attends to positions 0 .. past + r.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// Keys per partition of a row's split attention: a row up to this long is one block's work.
inline constexpr int64_t kPagedPartitionKeys = 256;
// The split rows' partials one launch holds at most; a longer batch is launched in slices of rows.
inline constexpr int64_t kPagedPartialBytes = int64_t{64} << 20;

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
