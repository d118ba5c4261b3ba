#pragma once
// Attention over a paged KV cache: keys and values live in fixed-size blocks of a shared pool,
// [block, slot, kv_heads*head_dim]; each sequence names its blocks in a block table. One call
// serves a whole batch step: every query row carries its sequence and position, so prefill
// chunks and single decode tokens of many sequences mix freely.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

using kernels::PagedAttentionShape;

// out[r, :] (heads*head_dim) = softmax(q_r . K^T / sqrt(d)) V over positions [0, positions[r]] of
// sequence sequences[r], whose keys/values the pools hold at block tables[seq*table_width + p/block_size],
// slot p % block_size. q rows are q_stride apart. The pools hold s.cache's elements: bf16 ones are
// widened (exactly) a row at a time, so the result is the fp32 kernel's over the widened values.
void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s);

// Prompt rows in tiles: rows [tiles[2t], tiles[2t] + tiles[2t + 1]) form tile t, 1 to
// kPromptTileRows rows of one table entry at positions below `reach`; each computed as
// paged_attention computes it. This is the exact form of the contract a GPU serves on tensor cores
// (cuda/paged_prompt_attention.h), run by the CPU and the tests' emulated device; a tile breaking
// the rules is an error naming it.
void paged_prompt_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            const int32_t* tiles, int64_t tile_count, int64_t reach, const PagedAttentionShape& s);

// Stores each row's key k[r * stride, + kv_width) and value v[r * stride, + kv_width) in the pools
// at the slot paged_attention reads position positions[r] of sequence sequences[r] from (bf16
// pools: rounded to nearest even, core/dtype_convert.h).
void paged_cache_write(void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s);

}  // namespace loom::kernels::cpu
