#pragma once
// MLP activations. SwiGLU reads a fused [gate | up] row (2*width) so both projections are one GEMM.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

// out[r, i] = silu(gate_up[r, i]) * gate_up[r, width + i]
void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width);
// Writes dgate_up (every element; it need not be zeroed). The backwards below write likewise.
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width);

// GELU, tanh approximation (GPT-2).
void gelu_forward(float* out, const float* in, int64_t n);
void gelu_backward(float* din, const float* dout, const float* in, int64_t n);

// Squared ReLU: max(x, 0)^2 (Nemotron-H).
void relu2_forward(float* out, const float* in, int64_t n);
void relu2_backward(float* din, const float* dout, const float* in, int64_t n);

// kernels::activation_forward_bf16 / activation_backward_bf16 (ops.h): the kernels above on the
// widened bf16 values, outputs rounded to bf16 (nearest even); with `amax`, the max |v| of what
// they write taken into *amax (amax_into's contract); with neither output, only the amax of the fp32
// values.
void activation_forward_bf16(MlpActivation activation, float* out, void* out16, const void* in16, int64_t rows,
                             int64_t width, float* amax = nullptr);
void activation_backward_bf16(MlpActivation activation, float* din, void* din16, float* dbias, const void* dout16,
                              const void* in16, int64_t rows, int64_t width, float* amax = nullptr);

}  // namespace loom::kernels::cpu
