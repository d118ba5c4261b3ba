#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/parallel.h"

#include <cmath>

namespace loom::kernels::cpu {

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * width;
    const float* u = g + width;
    float* o = out + r * width;
    for (int64_t i = 0; i < width; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * width;
    const float* u = g + width;
    const float* dy = dout + r * width;
    float* dg = dgate_up + r * 2 * width;
    float* du = dg + width;
    for (int64_t i = 0; i < width; ++i) {
      float sig = 1.0f / (1.0f + std::exp(-g[i]));
      float silu = g[i] * sig;
      du[i] += dy[i] * silu;
      dg[i] += dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* in, int64_t n) {
#pragma omp parallel for schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    float x = in[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n) {
#pragma omp parallel for schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    float x = in[i];
    float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
    float th = std::tanh(inner);
    float sech2 = 1.0f - th * th;
    float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] += grad * dout[i];
  }
}

}  // namespace loom::kernels::cpu
