#pragma once
// Flash attention on the device (FlashAttention-2's scheme), with the contracts of
// kernels::cpu's tiled kernel (flash_attention.h; shapes and visibility: kernels/types.h):
// causal by position, documents by id, GQA, q/k/v as strided views of a fused qkv, the output
// and its log-sum-exp forward; backward adds into dq, dk, dv and accepts a merged out/lse.
// Queries in blocks of kQueryRows (one warp each), keys in tiles of 32 staged in shared memory,
// an online softmax in registers: no [q_len, k_len] matrix exists. Tiles no query of the block
// sees are skipped. Backward: one pass owns dq (per query block), one owns dk and dv (per key
// block, over every query head of its kv head), so every gradient row has one writer and
// results are deterministic. fp32 arithmetic on CUDA cores; the bf16 forms read bf16 q, k, v
// (and out, dout), write bf16 out, and keep lse and the gradients fp32, and run on tensor cores
// (flash_attention_tc.h) at head_dim 64 and 128 with aligned views, on the CUDA-core kernel
// otherwise. head_dim up to 256. Visibility arrays live on the device.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                             cudaStream_t stream = nullptr);
void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                              const float* q, const float* k, const float* v, const FlashAttentionShape& s,
                              const AttentionVisibility& vis, cudaStream_t stream = nullptr);
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const FlashAttentionShape& s, const AttentionVisibility& vis,
                             cudaStream_t stream = nullptr);
void flash_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const FlashAttentionShape& s, const AttentionVisibility& vis,
                              cudaStream_t stream = nullptr);
// lse' = log(e^lse + e^part_lse), out' = out e^(lse - lse') + part_out e^(part_lse - lse').
void merge_attention_partials(float* out, float* lse, const float* part_out, const float* part_lse,
                              const FlashAttentionShape& s, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
