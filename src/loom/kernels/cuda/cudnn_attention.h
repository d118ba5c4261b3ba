#pragma once
// Causal self-attention through cuDNN's fused flash attention (scaled dot-product attention as an
// operation graph of cuDNN's backend API: Q K^T, scale, causal mask, softmax with its statistics,
// P V; backward: the graph cuDNN's fused SDPA backward engines recognise), with the contracts of
// the bf16 entries of flash_attention.h:
//   q, k, v: bf16 strided views (token-major rows [batch * seq, stride], heads as column blocks),
//     given to cuDNN as [batch, heads, seq, head_dim] tensors with strides, no copies; GQA.
//   forward: bf16 out (out_stride) and lse [batch, heads, q_len], fp32, the natural-log
//     log-sum-exp of the scaled scores: cuDNN's Stats tensor is max + log(sum exp), the same thing.
//   backward: cuDNN writes bf16 dQ, dK, dV into scratch (dense token-major rows), or straight into
//     strided views (CudnnGradientStrides: a fused q/k/v gradient's); the fp32 form adds them into
//     loom's dq, dk, dv (q/k/v strides). dQ is accumulated in fp32 inside cuDNN first.
// Serves: no visibility arrays (plain causal rows), q_len == k_len, head_dim 64 or 128, heads a
// multiple of kv_heads, 16-byte aligned tensors and strides that are multiples of 8 elements.
// cuDNN is loaded at run time (cudnn_library.h). Plans are built once per shape and strides and
// kept per device; their workspace comes from the caller's Scratch.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// Empty when cuDNN is loaded and serves this call (shape, visibility, tensors' alignment);
// otherwise why not. Never throws.
std::string cudnn_attention_refusal(const FlashAttentionShape& s, const AttentionVisibility& vis,
                                    std::initializer_list<const void*> tensors = {});

// Why cuDNN's SDPA backward does not serve a shape its forward serves (cudnn-frontend's SDPA
// backward refuses or works around the same): one query and one key; cuDNN 9.10.0 and 9.10.1
// (known bugs); up to 9.15.0, a key length not a multiple of 128 (the frontend adds a padding mask
// there). Empty when it serves, or when cuDNN is unavailable (cudnn_attention_refusal says so).
std::string cudnn_backward_refusal(const FlashAttentionShape& s);

// Row strides (elements) of the gradients the backward writes: dQ's, dK's and dV's; 0 for packed
// rows (heads x head_dim, kv_heads x head_dim). Strided rows let cuDNN write the gradients
// straight into the views of a fused q/k/v gradient.
struct CudnnGradientStrides {
  int64_t dq = 0, dk = 0, dv = 0;
};
// Builds (once) the plan of a served shape on the current device: empty when ready, else cuDNN's
// reason it could not be built (remembered: a shape that failed is not retried). Never throws a
// cuDNN error. `gradients`: the backward's gradient strides (a plan of their own).
std::string cudnn_attention_prepare(const FlashAttentionShape& s, bool backward,
                                    const CudnnGradientStrides& gradients = {});

// Throw loom::Error when the plan cannot be built or cuDNN fails.
void cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const FlashAttentionShape& s, Scratch& scratch,
                             cudaStream_t stream);
// The backward adds its gradients into dq, dk, dv (fp32, in q's, k's and v's layout); the _bf16 form
// writes cuDNN's bf16 gradients whole into dq16 [tokens, heads x head_dim], dk16 and dv16 [tokens,
// kv_heads x head_dim], rows packed.
void cudnn_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                              const FlashAttentionShape& s, Scratch& scratch, cudaStream_t stream);
// With `gradients` the _bf16 form writes rows of those strides instead (16-byte aligned pointers,
// strides multiples of 8; the plan prepared for them).
void cudnn_attention_backward_bf16(__nv_bfloat16* dq16, __nv_bfloat16* dk16, __nv_bfloat16* dv16,
                                   const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                                   const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                   const FlashAttentionShape& s, Scratch& scratch, cudaStream_t stream,
                                   const CudnnGradientStrides& gradients = {});

}  // namespace loom::kernels::cuda
