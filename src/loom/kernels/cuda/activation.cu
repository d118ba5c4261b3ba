#include "loom/kernels/cuda/activation.h"

#include "loom/core/error.h"
#include "loom/kernels/cuda/activation_math.cuh"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

// Each kernel over fp32 or bf16 tensors (bf16_io.cuh): the same fp32 arithmetic, a bf16 output
// rounded as it is stored. Rows of [gate | up] (2 width) into rows of width (launch_over_rows: no
// division per element). With `amax` (not null) each takes the max |v| of what it stores into it
// (amax.cuh; a condition the same for every thread, so the block's barrier is reached by all).
template <typename In, typename Out>
__global__ void swiglu_forward_kernel(Out* __restrict__ out, const In* __restrict__ gate_up, int64_t rows,
                                      int64_t width, unsigned* amax) {
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const float g = load(gate_up, r * 2 * width + i), u = load(gate_up, r * 2 * width + width + i);
      m = nan_max(m, fabsf(store(out, r * width + i, swiglu_value(g, u))));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <typename In, typename DOut, typename DIn>
__global__ void swiglu_backward_kernel(DIn* __restrict__ dgate_up, const DOut* __restrict__ dout,
                                       const In* __restrict__ gate_up, int64_t rows, int64_t width,
                                       unsigned* amax) {
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t i = column_start(); i < width; i += column_stride()) {
      const int64_t gi = r * 2 * width + i, ui = gi + width;
      const float g = load(gate_up, gi), u = load(gate_up, ui), dy = load(dout, r * width + i);
      m = nan_max(m, fabsf(store(dgate_up, ui, swiglu_up_grad(g, dy))));
      m = nan_max(m, fabsf(store(dgate_up, gi, swiglu_gate_grad(g, u, dy))));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// The SwiGLU kernels four columns at a time (pack4.cuh): width a multiple of 4 and every tensor
// pack-aligned, so each row's gate and up halves are too; the same values and amax per element.
template <typename In, typename Out>
__global__ void swiglu_forward4_kernel(Out* __restrict__ out, const In* __restrict__ gate_up, int64_t rows,
                                       int64_t width, unsigned* amax) {
  const int64_t packs = width / 4;
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const In* row = gate_up + r * 2 * width;
    for (int64_t p = column_start(); p < packs; p += column_stride()) {
      float g[4], u[4], y[4];
      load4(row, p, g);
      load4(row + width, p, u);
#pragma unroll
      for (int k = 0; k < 4; ++k) y[k] = swiglu_value(g[k], u[k]);
      m = nan_max(m, store4(out + r * width, p, y));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <typename In, typename DOut, typename DIn>
__global__ void swiglu_backward4_kernel(DIn* __restrict__ dgate_up, const DOut* __restrict__ dout,
                                        const In* __restrict__ gate_up, int64_t rows, int64_t width,
                                        unsigned* amax) {
  const int64_t packs = width / 4;
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const In* row = gate_up + r * 2 * width;
    DIn* drow = dgate_up + r * 2 * width;
    for (int64_t p = column_start(); p < packs; p += column_stride()) {
      float g[4], u[4], dy[4], dg[4], du[4];
      load4(row, p, g);
      load4(row + width, p, u);
      load4(dout + r * width, p, dy);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        du[k] = swiglu_up_grad(g[k], dy[k]);
        dg[k] = swiglu_gate_grad(g[k], u[k], dy[k]);
      }
      m = nan_max(m, store4(drow + width, p, du));
      m = nan_max(m, store4(drow, p, dg));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// Launch shapes for the kernels over rows: with an amax, fewer blocks (each loops over more of the
// tensor), so the atomics into it stay about kAmaxBlocks.
RowsLaunch rows_launch(int64_t rows, int64_t width, const unsigned* amax) {
  RowsLaunch l = launch_over_rows(rows, width);
  if (amax != nullptr) {
    l.grid.y = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(l.grid.y, kAmaxBlocks / l.grid.x)));
  }
  return l;
}

// SwiGLU forward and backward, four columns at a time where the widths and pointers allow.
template <typename In, typename Out>
void launch_swiglu_forward(Out* out, const In* gate_up, int64_t rows, int64_t width, unsigned* amax,
                           cudaStream_t stream) {
  if (width % 4 == 0 && pack4_aligned<In>(gate_up) && pack4_aligned<Out>(out)) {
    const RowsLaunch l = rows_launch(rows, width / 4, amax);
    swiglu_forward4_kernel<In, Out><<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width, amax);
  } else {
    const RowsLaunch l = rows_launch(rows, width, amax);
    swiglu_forward_kernel<In, Out><<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width, amax);
  }
  check_launch("swiglu_forward_kernel");
}
template <typename In, typename DOut, typename DIn>
void launch_swiglu_backward(DIn* dgate_up, const DOut* dout, const In* gate_up, int64_t rows, int64_t width,
                            unsigned* amax, cudaStream_t stream) {
  if (width % 4 == 0 && pack4_aligned<In>(gate_up) && pack4_aligned<DOut>(dout) && pack4_aligned<DIn>(dgate_up)) {
    const RowsLaunch l = rows_launch(rows, width / 4, amax);
    swiglu_backward4_kernel<In, DOut, DIn><<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows, width,
                                                                           amax);
  } else {
    const RowsLaunch l = rows_launch(rows, width, amax);
    swiglu_backward_kernel<In, DOut, DIn><<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows, width, amax);
  }
  check_launch("swiglu_backward_kernel");
}

template <typename In, typename Out>
__global__ void gelu_forward_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n, unsigned* amax) {
  float m = 0.0f;
  for (int64_t k = grid_start(); k < n; k += grid_stride()) {
    m = nan_max(m, fabsf(store(out, k, gelu_value(load(in, k)))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <typename In, typename DOut, typename DIn>
__global__ void gelu_backward_kernel(DIn* __restrict__ din, const DOut* __restrict__ dout, const In* __restrict__ in,
                                     int64_t n, unsigned* amax) {
  float m = 0.0f;
  for (int64_t k = grid_start(); k < n; k += grid_stride()) {
    m = nan_max(m, fabsf(store(din, k, gelu_grad(load(in, k), load(dout, k)))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// Squared ReLU (Nemotron's MLP): out = max(x, 0)^2, backward 2 max(x, 0) dout, each product rounded
// as the CPU's (one rounding per operation: no contraction into an FMA).
template <typename In, typename Out>
__global__ void relu2_forward_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n, unsigned* amax) {
  float m = 0.0f;
  for (int64_t k = grid_start(); k < n; k += grid_stride()) {
    m = nan_max(m, fabsf(store(out, k, relu2_value(load(in, k)))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <typename In, typename DOut, typename DIn>
__global__ void relu2_backward_kernel(DIn* __restrict__ din, const DOut* __restrict__ dout, const In* __restrict__ in,
                                      int64_t n, unsigned* amax) {
  float m = 0.0f;
  for (int64_t k = grid_start(); k < n; k += grid_stride()) {
    m = nan_max(m, fabsf(store(din, k, relu2_grad(load(in, k), load(dout, k)))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
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
                                                int64_t chunk, unsigned* amax) {
  const bool swiglu = activation == MlpActivation::Swiglu;
  const int64_t in_width = swiglu ? 2 * width : width;
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, k = blockIdx.y;
  float m = 0.0f;
  if (c < in_width) {  // no early return: every thread reaches the block's amax barrier
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
      m = nan_max(m, fabsf(store(din, r * in_width + c, v)));
      s = __fadd_rn(s, v);
    }
    partial[k * in_width + c] = s;
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

}  // namespace

void swiglu_forward(float* out, const float* gate_up, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  launch_swiglu_forward(out, gate_up, rows, width, nullptr, stream);
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t rows, int64_t width,
                     cudaStream_t stream) {
  if (rows * width == 0) return;
  launch_swiglu_backward(dgate_up, dout, gate_up, rows, width, nullptr, stream);
}

void gelu_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_forward_kernel<float, float><<<grid_for(n), kThreads, 0, stream>>>(out, in, n, nullptr);
  check_launch("gelu_forward_kernel");
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  gelu_backward_kernel<float, float, float><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n, nullptr);
  check_launch("gelu_backward_kernel");
}

void relu2_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_forward_kernel<float, float><<<grid_for(n), kThreads, 0, stream>>>(out, in, n, nullptr);
  check_launch("relu2_forward_kernel");
}

void relu2_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu2_backward_kernel<float, float, float><<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, n, nullptr);
  check_launch("relu2_backward_kernel");
}

namespace {
unsigned elements_grid(int64_t n, const unsigned* amax) { return amax != nullptr ? amax_grid(n) : grid_for(n); }

// The forward from a bf16 input into out of element type Out (fp32 or bf16).
template <typename Out>
void activation_forward_into(MlpActivation activation, Out* out, const bf16* in, int64_t rows, int64_t width,
                             unsigned* amax, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (activation == MlpActivation::Swiglu) {
    launch_swiglu_forward(out, in, rows, width, amax, stream);
    return;
  }
  if (activation == MlpActivation::Relu2) {
    relu2_forward_kernel<bf16, Out><<<elements_grid(n, amax), kThreads, 0, stream>>>(out, in, n, amax);
  } else {
    gelu_forward_kernel<bf16, Out><<<elements_grid(n, amax), kThreads, 0, stream>>>(out, in, n, amax);
  }
  check_launch("activation forward (bf16)");
}

// The backward from bf16 dout and input into din of element type DIn (fp32 or bf16).
template <typename DIn>
void activation_backward_into(MlpActivation activation, DIn* din, const bf16* dout, const bf16* in, int64_t rows,
                              int64_t width, unsigned* amax, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (activation == MlpActivation::Swiglu) {
    launch_swiglu_backward(din, dout, in, rows, width, amax, stream);
    return;
  }
  if (activation == MlpActivation::Relu2) {
    relu2_backward_kernel<bf16, bf16, DIn><<<elements_grid(n, amax), kThreads, 0, stream>>>(din, dout, in, n, amax);
  } else {
    gelu_backward_kernel<bf16, bf16, DIn><<<elements_grid(n, amax), kThreads, 0, stream>>>(din, dout, in, n, amax);
  }
  check_launch("activation backward (bf16)");
}

unsigned* amax_word(float* amax) { return reinterpret_cast<unsigned*>(amax); }
}  // namespace

void activation_forward_bf16(MlpActivation activation, float* out, void* out16, const void* in, int64_t rows,
                             int64_t width, float* amax, cudaStream_t stream) {
  if (rows * width == 0) return;
  if (out != nullptr) {
    activation_forward_into(activation, out, as_bf16(in), rows, width, amax_word(amax), stream);
  } else if (out16 == nullptr) {  // the amax alone, of the fp32 values
    LOOM_CHECK(amax != nullptr, "activation_forward_bf16: with no output, an amax");
    activation_forward_into(activation, static_cast<Discard*>(nullptr), as_bf16(in), rows, width, amax_word(amax),
                            stream);
  } else {
    activation_forward_into(activation, as_bf16(out16), as_bf16(in), rows, width, amax_word(amax), stream);
  }
}

namespace {
// The backward with the bias gradient's column sums (activation_backward_sums_kernel).
template <typename DIn>
void activation_backward_summing(MlpActivation activation, DIn* din, float* dbias, const bf16* dout, const bf16* in,
                                 int64_t rows, int64_t width, unsigned* amax, cudaStream_t stream) {
  const int64_t in_width = activation == MlpActivation::Swiglu ? 2 * width : width;
  const ColumnChunks l = column_chunks(rows, in_width, "cuda::activation_backward_bf16");
  Scratch scratch;
  float* partial = scratch.floats(l.chunks * in_width);
  activation_backward_sums_kernel<DIn>
      <<<l.grid, kThreads, 0, stream>>>(activation, din, partial, dout, in, rows, width, l.chunk, amax);
  check_launch("activation_backward_sums_kernel");
  add_partial_column_sums(dbias, partial, l.chunks, in_width, stream);
}

// Into din of element type DIn, summing the bias gradient when there is one.
template <typename DIn>
void activation_backward_to(MlpActivation activation, DIn* din, float* dbias, const bf16* dout, const bf16* in,
                            int64_t rows, int64_t width, unsigned* amax, cudaStream_t stream) {
  if (dbias != nullptr) return activation_backward_summing(activation, din, dbias, dout, in, rows, width, amax, stream);
  activation_backward_into(activation, din, dout, in, rows, width, amax, stream);
}
}  // namespace

void activation_backward_bf16(MlpActivation activation, float* din, void* din16, float* dbias, const void* dout,
                              const void* in, int64_t rows, int64_t width, float* amax, cudaStream_t stream) {
  if (rows * width == 0) return;
  if (din != nullptr) {
    activation_backward_to(activation, din, dbias, as_bf16(dout), as_bf16(in), rows, width, amax_word(amax), stream);
  } else if (din16 == nullptr) {  // the amax alone, of the fp32 values
    LOOM_CHECK(amax != nullptr && dbias == nullptr,
               "activation_backward_bf16: with no output, an amax and no bias sum");
    activation_backward_into(activation, static_cast<Discard*>(nullptr), as_bf16(dout), as_bf16(in), rows, width,
                             amax_word(amax), stream);
  } else {
    activation_backward_to(activation, as_bf16(din16), dbias, as_bf16(dout), as_bf16(in), rows, width,
                           amax_word(amax), stream);
  }
}

}  // namespace loom::kernels::cuda
