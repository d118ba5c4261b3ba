#pragma once
// MLP activations on the device, with the contracts of kernels::cpu's (activation.h):
//   swiglu: out[r, i] = silu(gate_up[r, i]) * gate_up[r, width + i] over a fused [gate | up] row;
//   gelu: the tanh approximation (GPT-2), written as x * sigmoid(2u) as on the CPU;
//   relu2: max(x, 0)^2 (Nemotron's squared ReLU), bit for bit the CPU's.
// Backward writes its gradient output whole (no zeroing needed first), as the CPU's. fp32 throughout; the
// sigmoid uses expf (the CPU a polynomial exp within 2e-7), so results agree to fp32 rounding.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width, cudaStream_t stream = nullptr);
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream = nullptr);
void gelu_forward(float* out, const float* in, int64_t n, cudaStream_t stream = nullptr);
void gelu_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream = nullptr);
void relu2_forward(float* out, const float* in, int64_t n, cudaStream_t stream = nullptr);
void relu2_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream = nullptr);

// The same over bf16 tensors (kernels::activation_forward_bf16 / activation_backward_bf16: the bf16
// recipe's MLP interior on a device; void* are 2-byte elements): the fp32 arithmetic on the
// widened values, each output rounded to bf16 (nearest even) as it is stored. in: [rows, 2 width]
// for SwiGLU, else [rows, width]. Forward writes out in fp32 (unrounded), or out16 in bf16 when out
// is null; backward writes din in fp32, or din16 in bf16 when din is null, and with dbias adds the
// fp32 gradient's column sums into it from the same pass (bias.h's order: the CPU's bits). With
// amax (a device float, not null), the max |v| of what each writes is taken into it (amax.cuh);
// with neither output (and no dbias) only that amax, of the fp32 values (activation_codes.h).
void activation_forward_bf16(MlpActivation activation, float* out, void* out16, const void* in, int64_t rows,
                             int64_t width, float* amax = nullptr, cudaStream_t stream = nullptr);
void activation_backward_bf16(MlpActivation activation, float* din, void* din16, float* dbias, const void* dout,
                              const void* in, int64_t rows, int64_t width, float* amax = nullptr,
                              cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
