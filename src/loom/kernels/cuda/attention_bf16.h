#pragma once
// Flash attention with bf16 operands (AttentionOperands::Bf16) behind the fp32 entries: q, k, v
// (backward: out and dout too) are cast to bf16 copies that keep their offsets and strides
// (attention_operands.h), the bf16 kernels of flash_attention.h run on them (tensor cores at
// head_dim 64 and 128), and forward's bf16 out is widened into the fp32 out. lse and the
// gradients are fp32 throughout. The copies are scratch of the device's cache (scratch.h).
#include <cuda_runtime.h>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void flash_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis,
                                  cudaStream_t stream = nullptr);
void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis,
                                   cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
