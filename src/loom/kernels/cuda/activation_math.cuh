#pragma once
// The MLP activations' arithmetic at one element, in fp32 (device code), shared by the kernels
// that store the activation or its gradient (activation.cu) and those that cast them straight to
// FP8 codes (activation_codes.cu), so both compute the same bits. As the CPU's (kernels::cpu's
// activation.h): SwiGLU over a [gate | up] pair, GELU's tanh form written as x * sigmoid(2u), and
// squared ReLU (Nemotron's) with each product rounded on its own.
#include <cuda_runtime.h>

namespace loom::kernels::cuda {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ inline float swiglu_value(float g, float u) { return g * sigmoid(g) * u; }
__device__ inline float gelu_value(float x) { return x * sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x)); }
__device__ inline float relu2_value(float x) {
  const float r = x > 0.0f ? x : 0.0f;
  return __fmul_rn(r, r);
}

// Each activation's input gradient at one element.
__device__ inline float swiglu_up_grad(float g, float dy) { return dy * g * sigmoid(g); }
__device__ inline float swiglu_gate_grad(float g, float u, float dy) {
  const float sig = sigmoid(g);
  return dy * u * sig * (1.0f + g * (1.0f - sig));
}
__device__ inline float gelu_grad(float x, float dy) {
  const float s = sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  return (s + x * s * (1.0f - s) * 2.0f * du_dx) * dy;
}
__device__ inline float relu2_grad(float x, float dy) { return x > 0.0f ? __fmul_rn(__fmul_rn(2.0f, x), dy) : 0.0f; }

}  // namespace loom::kernels::cuda
