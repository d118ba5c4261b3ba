#pragma once
// Flash attention on tensor cores for bf16 q, k, v (FlashAttention-2's scheme on mma.sync
// m16n8k16, fp32 accumulators), behind the bf16 entries of flash_attention.h, with their
// contracts: causal by position, documents by id, GQA, strided q/k/v views, bf16 out and fp32
// lse forward; backward adds fp32 gradients into dq, dk, dv. 64 queries per block (16 per warp),
// keys in tiles staged in shared memory by asynchronous copies; P and dS are rounded to bf16 for
// their products, as FlashAttention does. Backward is deterministic: one kernel owns dk and dv
// (per block of 64 keys, over every query head of its kv head), another owns dq (per block of 64
// queries), so every gradient element has one writer and no atomics.
// Serves head_dim 64 and 128 with 16-byte aligned q, k, v, out, dout and strides that are
// multiples of 8 elements; tensor_core_attention_supports says so, and the entries fall back to
// the CUDA-core kernel otherwise.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

bool tensor_core_attention_supports(const FlashAttentionShape& s, std::initializer_list<const void*> tensors);

void tensor_core_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, const FlashAttentionShape& s,
                                   const AttentionVisibility& vis, cudaStream_t stream);
// delta[b, h, i] = dout_i . out_i (fp32), computed by the caller.
void tensor_core_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const float* lse,
                                    const float* delta, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                    const __nv_bfloat16* v, const FlashAttentionShape& s,
                                    const AttentionVisibility& vis, cudaStream_t stream);

}  // namespace loom::kernels::cuda
