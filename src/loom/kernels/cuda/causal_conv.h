#pragma once
// Mamba's short causal depthwise convolution + SiLU on the device, with the contracts of
// kernels::cpu (causal_conv.h): one thread per output (token, channel), the window's taps summed
// in double in the CPU's order. Backward: one thread per input element gathers the gradients of
// the tokens whose windows read it, in token order as the CPU adds them; the weight and bias
// gradients are summed in double over row slices, then the slices in order (deterministic).
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

void causal_conv_silu_forward(float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents, cudaStream_t stream = nullptr);
void causal_conv_silu_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                               const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents, cudaStream_t stream = nullptr);
// s.seq more tokens per sequence after the window's (cpu/causal_conv.h): one token, a thread per
// (row, channel); more (a prompt's chunk), a thread per output, then a pass shifting the windows.
void causal_conv_silu_step(float* out, float* window, const int32_t* slots, const float* in, const float* weight,
                           const float* bias, const ConvShape& s, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
