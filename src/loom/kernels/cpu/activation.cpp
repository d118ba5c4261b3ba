#include "loom/core/error.h"
#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/amax.h"
#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/parallel.h"

#include <cmath>
#include <vector>

namespace loom::kernels::cpu {

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate_up + r * 2 * width;
    const float* u = g + width;
    float* o = out + r * width;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) o[i] = g[i] * fast_sigmoid(g[i]) * u[i];
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
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) {
      float sig = fast_sigmoid(g[i]);
      float silu = g[i] * sig;
      du[i] = dy[i] * silu;
      dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
    }
  }
}

namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
}  // namespace

// 0.5 (1 + tanh(u)) = sigmoid(2u): the tanh form without cancellation near zero.
void gelu_forward(float* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    float x = in[i];
    out[i] = x * fast_sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
  }
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    float x = in[i];
    float s = fast_sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
    float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[i] = (s + x * s * (1.0f - s) * 2.0f * du_dx) * dout[i];
  }
}

// Squared ReLU (Nemotron-H's MLP): max(x, 0)^2.
void relu2_forward(float* out, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float r = in[i] > 0.0f ? in[i] : 0.0f;
    out[i] = r * r;
  }
}

void relu2_backward(float* din, const float* dout, const float* in, int64_t n) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) din[i] = in[i] > 0.0f ? 2.0f * in[i] * dout[i] : 0.0f;
}

namespace {
int64_t input_width(MlpActivation activation, int64_t width) {
  return activation == MlpActivation::Swiglu ? 2 * width : width;
}
}  // namespace

void activation_forward_bf16(MlpActivation activation, float* out, void* out16, const void* in16, int64_t rows,
                             int64_t width, float* amax) {
  LOOM_CHECK(out != nullptr || out16 != nullptr || amax != nullptr, "activation_forward_bf16: with no output, an amax");
  const std::vector<float> in = widened_bf16(in16, rows * input_width(activation, width));
  std::vector<float> local;
  float* y = out;
  if (y == nullptr) {
    local.resize(static_cast<size_t>(rows * width));
    y = local.data();
  }
  if (activation == MlpActivation::Swiglu) {
    swiglu_forward(y, in.data(), rows, width);
  } else if (activation == MlpActivation::Relu2) {
    relu2_forward(y, in.data(), rows * width);
  } else {
    gelu_forward(y, in.data(), rows * width);
  }
  if (out == nullptr && out16 != nullptr) narrow_floats(out16, y, rows * width, DType::BF16);
  if (amax != nullptr) {
    if (out != nullptr || out16 == nullptr) {  // fp32 out, or the amax alone of the fp32 values
      amax_into(amax, y, rows * width);
    } else {
      amax_into_bf16(amax, out16, rows * width);
    }
  }
}

void activation_backward_bf16(MlpActivation activation, float* din, void* din16, float* dbias, const void* dout16,
                              const void* in16, int64_t rows, int64_t width, float* amax) {
  LOOM_CHECK(din != nullptr || din16 != nullptr || (amax != nullptr && dbias == nullptr),
             "activation_backward_bf16: with no output, an amax and no bias sum");
  const int64_t in_count = rows * input_width(activation, width);
  const std::vector<float> in = widened_bf16(in16, in_count), dout = widened_bf16(dout16, rows * width);
  std::vector<float> local;
  float* d = din;
  if (d == nullptr) {
    local.resize(static_cast<size_t>(in_count));
    d = local.data();
  }
  if (activation == MlpActivation::Swiglu) {
    swiglu_backward(d, dout.data(), in.data(), rows, width);
  } else if (activation == MlpActivation::Relu2) {
    relu2_backward(d, dout.data(), in.data(), rows * width);
  } else {
    gelu_backward(d, dout.data(), in.data(), rows * width);
  }
  if (dbias != nullptr) add_column_sums(dbias, d, rows, input_width(activation, width));
  if (din == nullptr && din16 != nullptr) narrow_floats(din16, d, in_count, DType::BF16);
  if (amax != nullptr) {
    if (din != nullptr || din16 == nullptr) {  // fp32 din, or the amax alone of the fp32 values
      amax_into(amax, d, in_count);
    } else {
      amax_into_bf16(amax, din16, in_count);
    }
  }
}
}  // namespace loom::kernels::cpu
