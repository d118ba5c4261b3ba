#include "loom/kernels/cuda/activation.h"

#include <string>

#include "loom/core/error.h"
#include "loom/kernels/column_sums.h"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Each activation's input gradient at one element, in fp32: the backward kernels below and the
// one that also sums the columns (activation_backward_sums_kernel) compute the same.
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
// One rounding per operation (no contraction into an FMA), as the CPU's.
__device__ inline float relu2_grad(float x, float dy) { return x > 0.0f ? __fmul_rn(__fmul_rn(2.0f, x), dy) : 0.0f; }

// Each kernel over fp32 or bf16 tensors (bf16_io.cuh): the same fp32 arithmetic, a bf16 output
// rounded as it is stored. Rows of [gate | up] (2 width) into rows of width (launch_over_rows: no
// division per element).
template <typename In, typename Out>
__global__ void swiglu_forward_kernel(Out* __restrict__ out, const In* __restrict__ gate_up, int64_t rows,
                                      int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const float g = load(gate_up, r * 2 * width + i), u = load(gate_up, r * 2 * width + width + i);
      store(out, r * width + i, g * sigmoid(g) * u);
    }
  }
}

template <typename In, typename DOut, typename DIn>
__global__ void swiglu_backward_kernel(DIn* __restrict__ dgate_up, const DOut* __restrict__ dout,
                                       const In* __restrict__ gate_up, int64_t rows, int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const int64_t gi = r * 2 * width + i, ui = gi + width;
      const float g = load(gate_up, gi), u = load(gate_up, ui), dy = load(dout, r * width + i);
      store(dgate_up, ui, swiglu_up_grad(g, dy));
      store(dgate_up, gi, swiglu_gate_grad(g, u, dy));
    }
  }
}

template <typename In, typename Out>
__global__ void gelu_forward_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load(in, k);
    store(out, k, x * sigmoid(2.0f * kSqrt2OverPi * (x + kCubic * x * x * x)));
  }
}

template <typename In, typename DOut, typename DIn>
__global__ void gelu_backward_kernel(DIn* __restrict__ din, const DOut* __restrict__ dout, const In* __restrict__ in,
                                     int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(din, k, gelu_grad(load(in, k), load(dout, k)));
  }
}

// Squared ReLU (Nemotron's MLP): out = max(x, 0)^2, backward 2 max(x, 0) dout, each product rounded
// as the CPU's (one rounding per operation: no contraction into an FMA).
template <typename In, typename Out>
__global__ void relu2_forward_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load(in, k), r = x > 0.0f ? x : 0.0f;
    store(out, k, __fmul_rn(r, r));
  }
}

template <typename In, typename DOut, typename DIn>
__global__ void relu2_backward_kernel(DIn* __restrict__ din, const DOut* __restrict__ dout, const In* __restrict__ in,
                                      int64_t n) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(din, k, relu2_grad(load(in, k), load(dout, k)));
  }
}

using bf16 = __nv_bfloat16;
const bf16* as_bf16(const void* p) { return static_cast<const bf16*>(p); }
bf16* as_bf16(void* p) { return static_cast<bf16*>(p); }

// The backward over bf16 dout and input, writing din [rows, in_width] (fp32 or bf16) and each
// column's sum of the fp32 gradient over chunk k's rows into partial[k, c]: chunk_column_sums'
// order (column_sums.h), so add_partial_column_sums finishes the bias gradient as add_column_sums
// would from an fp32 din. A thread per (column, chunk); a warp's threads read consecutive columns.
template <typename DIn>
__global__ void activation_backward_sums_kernel(MlpActivation activation, DIn* __restrict__ din,
                                                float* __restrict__ partial, const bf16* __restrict__ dout,
                                                const bf16* __restrict__ in, int64_t rows, int64_t width,
                                                int64_t chunk) {
  const bool swiglu = activation == MlpActivation::Swiglu;
  const int64_t in_width = swiglu ? 2 * width : width;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, k = blockIdx.y;
  if (c >= in_width) return;
  const int64_t last = min(rows, (k + 1) * chunk);
  const int64_t i = swiglu && c >= width ? c - width : c;  // SwiGLU: the feature of a gate or up column
  float s = 0.0f;
  for (int64_t r = k * chunk; r < last; ++r) {
    const float dy = load(dout, r * width + i);
    float v = 0.0f;
    if (swiglu) {
      const float g = load(in, r * in_width + i);
      v = c < width ? swiglu_gate_grad(g, load(in, r * in_width + width + i), dy) : swiglu_up_grad(g, dy);
    } else if (activation == MlpActivation::Relu2) {
      v = relu2_grad(load(in, r * in_width + c), dy);
    } else {
      v = gelu_grad(load(in, r * in_width + c), dy);
    }
    store(din, r * in_width + c, v);
    s = __fadd_rn(s, v);
  }
  partial[k * in_width + c] = s;
}

}  // namespace

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  swiglu_forward_kernel<float, float><<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width);
  check_launch("swiglu_forward_kernel");
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  swiglu_backward_kernel<float, float, float><<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows, width);
  check_launch("swiglu_backward_kernel");
}

void gelu_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<float, float><<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<float, float, float><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  check_launch("gelu_backward_kernel");
}

void relu2_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_forward_kernel<float, float><<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  check_launch("relu2_forward_kernel");
}

void relu2_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_backward_kernel<float, float, float><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  check_launch("relu2_backward_kernel");
}

namespace {
// The forward from a bf16 input into out of element type Out (fp32 or bf16).
template <typename Out>
void activation_forward_into(MlpActivation activation, Out* out, const bf16* in, int64_t rows, int64_t width,
                             cudaStream_t stream) {
  const int64_t n = rows * width;
  if (activation == MlpActivation::Swiglu) {
    const RowsLaunch l = launch_over_rows(rows, width);
    swiglu_forward_kernel<bf16, Out><<<l.grid, l.block, 0, stream>>>(out, in, rows, width);
  } else if (activation == MlpActivation::Relu2) {
    relu2_forward_kernel<bf16, Out><<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  } else {
    gelu_forward_kernel<bf16, Out><<<grid_for(n), kThreads, 0, stream>>>(out, in, n);
  }
  check_launch("activation forward (bf16)");
}

// The backward from bf16 dout and input into din of element type DIn (fp32 or bf16).
template <typename DIn>
void activation_backward_into(MlpActivation activation, DIn* din, const bf16* dout, const bf16* in, int64_t rows,
                              int64_t width, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (activation == MlpActivation::Swiglu) {
    const RowsLaunch l = launch_over_rows(rows, width);
    swiglu_backward_kernel<bf16, bf16, DIn><<<l.grid, l.block, 0, stream>>>(din, dout, in, rows, width);
  } else if (activation == MlpActivation::Relu2) {
    relu2_backward_kernel<bf16, bf16, DIn><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  } else {
    gelu_backward_kernel<bf16, bf16, DIn><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n);
  }
  check_launch("activation backward (bf16)");
}
}  // namespace

void activation_forward_bf16(MlpActivation activation, float* out, void* out16, const void* in, int64_t rows,
                             int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  if (out != nullptr) {
    activation_forward_into(activation, out, as_bf16(in), rows, width, stream);
  } else {
    activation_forward_into(activation, as_bf16(out16), as_bf16(in), rows, width, stream);
  }
}

namespace {
// The backward with the bias gradient's column sums (activation_backward_sums_kernel).
template <typename DIn>
void activation_backward_summing(MlpActivation activation, DIn* din, float* dbias, const bf16* dout, const bf16* in,
                                 int64_t rows, int64_t width, cudaStream_t stream) {
  const int64_t in_width = activation == MlpActivation::Swiglu ? 2 * width : width;
  const int64_t chunk = column_sum_chunk(rows), chunks = (rows + chunk - 1) / chunk;
  const int64_t column_blocks = (in_width + kThreads - 1) / kThreads;
  LOOM_CHECK(column_blocks < (int64_t{1} << 31) && chunks <= kColumnSumChunks,
             "cuda::activation_backward_bf16: " + std::to_string(rows) + " x " + std::to_string(in_width) +
                 " exceeds one grid");
  Scratch scratch;
  float* partial = scratch.floats(chunks * in_width);
  activation_backward_sums_kernel<DIn>
      <<<dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
          activation, din, partial, dout, in, rows, width, chunk);
  check_launch("activation_backward_sums_kernel");
  add_partial_column_sums(dbias, partial, chunks, in_width, stream);
}

// Into din of element type DIn, summing the bias gradient when there is one.
template <typename DIn>
void activation_backward_to(MlpActivation activation, DIn* din, float* dbias, const bf16* dout, const bf16* in,
                            int64_t rows, int64_t width, cudaStream_t stream) {
  if (dbias != nullptr) return activation_backward_summing(activation, din, dbias, dout, in, rows, width, stream);
  activation_backward_into(activation, din, dout, in, rows, width, stream);
}
}  // namespace

void activation_backward_bf16(MlpActivation activation, float* din, void* din16, float* dbias, const void* dout,
                              const void* in, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  if (din != nullptr) {
    activation_backward_to(activation, din, dbias, as_bf16(dout), as_bf16(in), rows, width, stream);
  } else {
    activation_backward_to(activation, as_bf16(din16), dbias, as_bf16(dout), as_bf16(in), rows, width, stream);
  }
}

}  // namespace loom::kernels::cuda
