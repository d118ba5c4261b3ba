#pragma once
// Flash attention with bf16 operands (AttentionOperands::Bf16) behind the fp32 entries: q, k, v
// (backward: out and dout too) are cast to bf16 copies that keep their offsets and strides
// (attention_operands.h), the bf16 kernels of flash_attention.h run on them (tensor cores at
// head_dim 64 and 128), and forward's bf16 out is widened into the fp32 out. lse and the
// gradients are fp32 throughout. The copies are scratch of the device's cache (scratch.h).
// Where cuDNN serves the call (cudnn_attention.h), its fused flash attention runs on the same
// bf16 copies instead of loom's kernels; LOOM_ATTENTION (environment) chooses:
//   auto (default): cuDNN wherever it serves, loom's kernels elsewhere;
//   cudnn: cuDNN for every call, an Error saying why where it cannot;
//   loom: loom's kernels always.
// A call that falls back says why on stderr, once per reason; the first call on cuDNN says so.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>

#include "loom/kernels/cuda/rope.h"
#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void flash_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis,
                                  cudaStream_t stream = nullptr);
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis,
                                   cudaStream_t stream = nullptr);

// The same on bf16 tensors: q, k, v, the output (forward) and its gradient (backward) in the
// shape's layout (strides in elements, 2 bytes each), handed to the bf16 kernels as they are: the
// values the fp32 entries cast to bf16 or widen from them, without those passes
// (kernels::flash_attention_forward_bf16_tensors, ops.h).
void flash_attention_forward_bf16_tensors(void* out16, float* lse, const void* q16, const void* k16, const void* v16,
                                          const FlashAttentionShape& s, const AttentionVisibility& vis,
                                          cudaStream_t stream = nullptr);
void flash_attention_backward_bf16_tensors(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                           const float* lse, const void* q16, const void* k16, const void* v16,
                                           const FlashAttentionShape& s, const AttentionVisibility& vis,
                                           cudaStream_t stream = nullptr);
// kernels::QkvRotation with its table's device mirror (null: no rotation).
struct DeviceQkvRotation {
  const DeviceRopeTable* table = nullptr;
  int64_t seq = 0;
  const int32_t* positions = nullptr;
};

// The gradients written whole in bf16 views (kernels::flash_attention_backward_bf16_gradients): on
// cuDNN its bf16 gradients written into them at their strides (where such a plan builds; else
// written packed and copied in) and rotated there (widened, rotated back in fp32, rounded, as the
// fp32 path rotates the widened ones); on loom's kernels the fp32 ones rotated and
// rounded; with dbias_* each view's column sums (column_sums.h's order) of those values added in.
void flash_attention_backward_bf16_gradients(void* dq16, void* dk16, void* dv16, float* dbias_q, float* dbias_k,
                                             float* dbias_v, const void* dout16, const void* out16, const float* lse,
                                             const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const DeviceQkvRotation& rotation, cudaStream_t stream = nullptr);

// The gradients written whole in fp32 views (kernels::flash_attention_backward_fp32_gradients): on
// cuDNN its bf16 gradients widened into them, q's and k's rotated back in the same pass
// (rope_backward_widened); on loom's kernels the views zeroed, the fp32 gradients added and rotated.
// `amax` (null: none): the max |value| of the views as written taken into it (amax_into's
// contract), by the widening passes on cuDNN, by a pass over the views on loom's kernels.
void flash_attention_backward_fp32_gradients(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const DeviceQkvRotation& rotation, float* amax,
                                             cudaStream_t stream = nullptr);

// Empty when a call of this shape runs on cuDNN; otherwise why it runs on loom's kernels (plans
// are built here, once per shape). Throws only for a bad LOOM_ATTENTION, or under
// LOOM_ATTENTION=cudnn where cuDNN cannot serve.
std::string attention_fallback_reason(const FlashAttentionShape& s, const AttentionVisibility& vis, bool backward,
                                      std::initializer_list<const void*> tensors = {});

// Where cuDNN serves a backward (attention_fallback_reason empty): empty when its bf16 gradients
// can be written straight into the views dq16, dk16, dv16 at the shape's q/k/v row strides (each
// view 16-byte aligned and a plan at those strides built, once per shape); otherwise why they go
// through a packed copy, said once per reason on stderr.
std::string cudnn_gradient_views_refusal(const FlashAttentionShape& s, const void* dq16, const void* dk16,
                                         const void* dv16);

// dst[r * dst_stride + c] += src[r * src_stride + c] for r < rows, c < width (device memory).
void add_bf16_rows(float* dst, int64_t dst_stride, const __nv_bfloat16* src, int64_t src_stride, int64_t rows,
                   int64_t width, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
