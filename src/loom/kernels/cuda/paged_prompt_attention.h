#pragma once
// Prompt rows' attention over a paged KV cache on tensor cores (kernels::paged_prompt_attention's
// contract, ops.h): FlashAttention-2's forward on mma.sync m16n8k16 with fp32 accumulators, as
// flash_attention_tc.h, reading the keys and values of a bf16 pool through the block table. One
// block per (query head, prompt tile, partition below): a tile is up to kPromptTileRows rows of one
// table entry, its queries rounded to bf16 as they are staged, the probabilities rounded to bf16
// for their product with the values (as FlashAttention and vLLM's prefill do); outputs fp32.
// Key tiles of 64 start at position 0 and are aligned to absolute positions, the same tiles for
// every row of a sequence whatever else the batch holds; the tiles a row does not see (all its
// keys hidden) leave its maximum, sum and accumulators exactly as they were (scores -inf, weights
// +0, correction 1, keys past the tile's last query zero-filled, never read). So a row's result
// depends on its own query, position and sequence only: the same bits alone as in any batch, in
// any prompt chunking (the engine's batch invariance, docs/serving.md).
// Rows at position kPromptPartitionKeys or later are split over the keys, in partitions of that
// many positions (a block per tile, head and partition, so a short chunk at a long context still
// fills the GPU), and a second kernel merges each row's partitions in order: which partitions a row
// has depends on its position only, so the split keeps the bits a row's own.
// Serves bf16 pools, head_dim 64 and 128, q and out rows 16-byte aligned (q's stride a multiple of
// 4 floats): kernels::paged_prompt_attention_on_tensor_cores (ops.h) routes only those here.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// Positions per partition of a prompt row's keys (a fixed size: the result depends on it).
inline constexpr int64_t kPromptPartitionKeys = 2048;

// tiles: [tile_count][2] (first row, rows) on the device, trusted as the model built them (1 to
// kPromptTileRows rows of one table entry, consecutive positions; the CPU's entry checks them);
// reach: one more than the tiles' last position (the partitions launched). out rows are
// [heads * head_dim].
void paged_prompt_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            const int32_t* tiles, int64_t tile_count, int64_t reach, const PagedAttentionShape& s,
                            cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
