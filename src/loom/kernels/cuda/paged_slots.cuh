#pragma once
// Where a position of a sequence lives in a paged KV cache's pool (kernels/types.h,
// PagedAttentionShape): its block table names the block, the position's offset in it the slot.
// Shared by the decoding (paged_attention.cu) and prompt (paged_prompt_attention.cu) kernels.
// Device code only.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

// A sequence's block table; null ids: one contiguous cache (position t is slot t). Blocks of a
// power of two positions (the engine's 16) take a shift and a mask, others a 32-bit division
// (positions are int32).
struct BlockTable {
  const int32_t* ids;
  int block_size, block_shift;  // block_shift: log2(block_size), or -1
  __device__ BlockTable(const int32_t* table, int64_t size)
      : ids(table), block_size(static_cast<int>(size)), block_shift(-1) {
    if ((size & (size - 1)) != 0) return;
    block_shift = 0;
    while ((int64_t{1} << block_shift) < size) ++block_shift;
  }
  __device__ int64_t slot(int32_t t) const {
    if (ids == nullptr) return t;
    if (block_shift >= 0) return (static_cast<int64_t>(ids[t >> block_shift]) << block_shift) + (t & (block_size - 1));
    const int32_t entry = t / block_size;
    return static_cast<int64_t>(ids[entry]) * block_size + (t - entry * block_size);
  }
};

}  // namespace loom::kernels::cuda
