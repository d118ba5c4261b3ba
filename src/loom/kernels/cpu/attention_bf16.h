#pragma once
// Flash attention with bf16 operands (AttentionOperands::Bf16) on the CPU: what the GPU's
// tensor-core kernels compute, emulated. q, k, v (backward: also out and dout) are copied rounded
// to bf16 (nearest even), keeping their strides (attention_operands.h), the fp32 tiled kernel
// (flash_attention.h) runs on the copies, and forward's out is rounded to bf16. lse and the
// gradients stay fp32. The GPU also rounds the probabilities (and their gradients) to bf16 for
// its products; this emulation keeps them fp32, so the two agree to bf16's precision, not bit for
// bit.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

void flash_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis);
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis);

// The same on bf16 tensors (q, k, v, out, dout in the shape's layout, 2 bytes per element):
// kernels::flash_attention_forward_bf16_tensors. They are widened and the forms above run.
void flash_attention_forward_bf16_tensors(void* out16, float* lse, const void* q16, const void* k16, const void* v16,
                                          const FlashAttentionShape& s, const AttentionVisibility& vis);
void flash_attention_backward_bf16_tensors(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                           const float* lse, const void* q16, const void* k16, const void* v16,
                                           const FlashAttentionShape& s, const AttentionVisibility& vis);
// kernels::flash_attention_backward_bf16_gradients: the form above into zeroed fp32 gradients, q's
// and k's rotated back with a rotation (rope_backward), each rounded into its bf16 view, and with
// dbias_* their column sums (column_sums.h's order).
void flash_attention_backward_bf16_gradients(void* dq16, void* dk16, void* dv16, float* dbias_q, float* dbias_k,
                                             float* dbias_v, const void* dout16, const void* out16, const float* lse,
                                             const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation = {});
// kernels::flash_attention_backward_fp32_gradients: the backward above into each view zeroed
// first (only its [rows, width] region), q's and k's rotated back with a rotation (rope_backward);
// with `amax`, the max |value| of the three views as written taken into it (amax_into).
void flash_attention_backward_fp32_gradients(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation = {}, float* amax = nullptr);

}  // namespace loom::kernels::cpu
