#include "loom/kernels/cuda/activation.h"

#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Rows of [gate | up] (2 width) into rows of width (launch_over_rows: no division per element).
__global__ void swiglu_forward_kernel(float* __restrict__ out, const float* __restrict__ gate_up, int64_t rows,
                                      int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const float g = gate_up[r * 2 * width + i], u = gate_up[r * 2 * width + width + i];
      out[r * width + i] = g * sigmoid(g) * u;
    }
  }
}

__global__ void swiglu_backward_kernel(float* __restrict__ dgate_up, const float* __restrict__ dout,
                                       const float* __restrict__ gate_up, int64_t rows, int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const int64_t gi = r * 2 * width + i, ui = gi + width;
      const float g = gate_up[gi], u = gate_up[ui], dy = dout[r * width + i];
      const float sig = sigmoid(g);
      dgate_up[ui] = dy * g * sig;
      dgate_up[gi] = dy * u * sig * (1.0f + g * (1.0f - sig));
    }
  }
}

__global__ void gelu_forward_kernel(float* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[k];
    out[k] = x * sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
  }
}

__global__ void gelu_backward_kernel(float* __restrict__ din, const float* __restrict__ dout,
                                     const float* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[k];
    const float s = sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    din[k] = (s + x * s * (1.0f - s) * 2.0f * du_dx) * dout[k];
  }
}

// Squared ReLU (Nemotron's MLP): out = max(x, 0)^2, backward 2 max(x, 0) dout, each product rounded
// as the CPU's (one rounding per operation: no contraction into an FMA).
__global__ void relu2_forward_kernel(float* __restrict__ out, const float* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float r = in[k] > 0.0f ? in[k] : 0.0f;
    out[k] = __fmul_rn(r, r);
  }
}

__global__ void relu2_backward_kernel(float* __restrict__ din, const float* __restrict__ dout,
                                      const float* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[k];
    din[k] = x > 0.0f ? __fmul_rn(__fmul_rn(2.0f, x), dout[k]) : 0.0f;
  }
}

}  // namespace

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  swiglu_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width);
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  swiglu_backward_kernel<<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows, width);
  check_launch("swiglu_backward_kernel");
}

void gelu_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  check_launch("gelu_backward_kernel");
}

void relu2_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  check_launch("relu2_forward_kernel");
}

void relu2_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  check_launch("relu2_backward_kernel");
}

}  // namespace loom::kernels::cuda
