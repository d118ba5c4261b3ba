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
// A thread takes kRows rows per turn (r0, r0 + gridDim.y, ...), loading all of them before any
// arithmetic: with an amax the grid is capped (rows_launch) and a thread walks many rows, where
// one row's two or three 8-byte loads at a time hold too few bytes in flight for the bandwidth. A
// row past the end is read as the turn's first (no branch among the loads), neither stored nor
// maxed.
__device__ inline int64_t turn_row(int64_t r0, int j, int64_t rows) {
  const int64_t r = r0 + j * static_cast<int64_t>(gridDim.y);
  return r < rows ? r : r0;
}

template <int kRows, typename In, typename Out>
__global__ void swiglu_forward4_kernel(Out* __restrict__ out, const In* __restrict__ gate_up, int64_t rows,
                                       int64_t width, unsigned* amax) {
  const int64_t packs = width / 4;
  float m = 0.0f;
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += kRows * static_cast<int64_t>(gridDim.y)) {
    for (int64_t p = column_start(); p < packs; p += column_stride()) {
      float g[kRows][4], u[kRows][4];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const In* row = gate_up + turn_row(r0, j, rows) * 2 * width;
        load4(row, p, g[j]);
        load4(row + width, p, u[j]);
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int64_t r = r0 + j * static_cast<int64_t>(gridDim.y);
        if (r >= rows) break;
        float y[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = swiglu_value(g[j][k], u[j][k]);
        m = nan_max(m, store4(out + r * width, p, y));
      }
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <int kRows, typename In, typename DOut, typename DIn>
__global__ void swiglu_backward4_kernel(DIn* __restrict__ dgate_up, const DOut* __restrict__ dout,
                                        const In* __restrict__ gate_up, int64_t rows, int64_t width,
                                        unsigned* amax) {
  const int64_t packs = width / 4;
  float m = 0.0f;
  for (int64_t r0 = blockIdx.y; r0 < rows; r0 += kRows * static_cast<int64_t>(gridDim.y)) {
    for (int64_t p = column_start(); p < packs; p += column_stride()) {
      float g[kRows][4], u[kRows][4], dy[kRows][4];
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int64_t r = turn_row(r0, j, rows);
        load4(gate_up + r * 2 * width, p, g[j]);
        load4(gate_up + r * 2 * width + width, p, u[j]);
        load4(dout + r * width, p, dy[j]);
      }
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int64_t r = r0 + j * static_cast<int64_t>(gridDim.y);
        if (r >= rows) break;
        float dg[4], du[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          du[k] = swiglu_up_grad(g[j][k], dy[j][k]);
          dg[k] = swiglu_gate_grad(g[j][k], u[j][k], dy[j][k]);
        }
        DIn* drow = dgate_up + r * 2 * width;
        m = nan_max(m, store4(drow + width, p, du));
        m = nan_max(m, store4(drow, p, dg));
      }
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
    if (amax != nullptr) {  // a capped grid: two rows per turn
      swiglu_forward4_kernel<2, In, Out><<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width, amax);
    } else {
      swiglu_forward4_kernel<1, In, Out><<<l.grid, l.block, 0, stream>>>(out, gate_up, rows, width, amax);
    }
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
    if (amax != nullptr) {  // a capped grid: two rows per turn
      swiglu_backward4_kernel<2, In, DOut, DIn><<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows,
                                                                                width, amax);
    } else {
      swiglu_backward4_kernel<1, In, DOut, DIn><<<l.grid, l.block, 0, stream>>>(dgate_up, dout, gate_up, rows,
                                                                                width, amax);
    }
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

// Blocks for n elements so each thread has about one step of grid_pack_steps<kPacks> (capped:
// grid_for, or amax_grid with an amax).
unsigned flat_packs_grid(int64_t n, int64_t packs_per_thread, const unsigned* amax) {
  const int64_t threads = (n + 4 * packs_per_thread - 1) / (4 * packs_per_thread);
  return amax != nullptr ? amax_grid(threads) : grid_for(threads);
}
// Packs per thread per step: the forward's four (32 bytes of bf16 input in flight per thread), the
// backward's two of each of its two inputs.
constexpr int kForwardPacks = 4, kBackwardPacks = 2;

// An element-wise activation's value and input gradient (GELU's, or squared ReLU's: kActivation).
template <MlpActivation kActivation>
__device__ inline float flat_value(float x) {
  return kActivation == MlpActivation::Relu2 ? relu2_value(x) : gelu_value(x);
}
template <MlpActivation kActivation>
__device__ inline float flat_grad(float x, float dy) {
  return kActivation == MlpActivation::Relu2 ? relu2_grad(x, dy) : gelu_grad(x, dy);
}

// GELU's or squared ReLU's forward and backward four elements per access (every tensor
// pack-aligned; grid_pack_steps): the same value and amax per element as the one-element kernels.
template <MlpActivation kActivation, typename In, typename Out>
__global__ void activation_forward4_kernel(Out* __restrict__ out, const In* __restrict__ in, int64_t n,
                                           unsigned* amax) {
  float m = 0.0f;
  float x[kForwardPacks][4];
  grid_pack_steps<kForwardPacks>(
      n, [&](int j, int64_t p) { load4(in, p, x[j]); },
      [&](int j, int64_t p) {
        float y[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) y[k] = flat_value<kActivation>(x[j][k]);
        const float stored = store4(out, p, y);
        if (amax != nullptr) m = nan_max(m, stored);  // no max per element where none is asked for
      },
      [&](int64_t i) { m = nan_max(m, fabsf(store(out, i, flat_value<kActivation>(load(in, i))))); });
  if (amax != nullptr) block_amax_into(amax, m);
}

template <MlpActivation kActivation, typename In, typename DOut, typename DIn>
__global__ void activation_backward4_kernel(DIn* __restrict__ din, const DOut* __restrict__ dout,
                                            const In* __restrict__ in, int64_t n, unsigned* amax) {
  float m = 0.0f;
  float x[kBackwardPacks][4], dy[kBackwardPacks][4];
  grid_pack_steps<kBackwardPacks>(
      n,
      [&](int j, int64_t p) {
        load4(in, p, x[j]);
        load4(dout, p, dy[j]);
      },
      [&](int j, int64_t p) {
        float g[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) g[k] = flat_grad<kActivation>(x[j][k], dy[j][k]);
        const float stored = store4(din, p, g);
        if (amax != nullptr) m = nan_max(m, stored);
      },
      [&](int64_t i) { m = nan_max(m, fabsf(store(din, i, flat_grad<kActivation>(load(in, i), load(dout, i))))); });
  if (amax != nullptr) block_amax_into(amax, m);
}

unsigned elements_grid(int64_t n, const unsigned* amax) { return amax != nullptr ? amax_grid(n) : grid_for(n); }

// GELU or squared ReLU forward and backward over flat tensors: four elements per access where
// every pointer allows, else one at a time. An amax (not null) caps the grid (amax_grid).
template <MlpActivation kActivation, typename In, typename Out>
void launch_flat_forward(Out* out, const In* in, int64_t n, unsigned* amax, cudaStream_t stream) {
  constexpr bool kRelu2 = kActivation == MlpActivation::Relu2;
  if (pack4_aligned<In>(in) && pack4_aligned<Out>(out)) {
    activation_forward4_kernel<kActivation, In, Out>
        <<<flat_packs_grid(n, kForwardPacks, amax), kThreads, 0, stream>>>(out, in, n, amax);
  } else if (kRelu2) {
    relu2_forward_kernel<In, Out><<<elements_grid(n, amax), kThreads, 0, stream>>>(out, in, n, amax);
  } else {
    gelu_forward_kernel<In, Out><<<elements_grid(n, amax), kThreads, 0, stream>>>(out, in, n, amax);
  }
  check_launch(kRelu2 ? "relu2 forward" : "gelu forward");
}

template <MlpActivation kActivation, typename In, typename DOut, typename DIn>
void launch_flat_backward(DIn* din, const DOut* dout, const In* in, int64_t n, unsigned* amax, cudaStream_t stream) {
  constexpr bool kRelu2 = kActivation == MlpActivation::Relu2;
  if (pack4_aligned<In>(in) && pack4_aligned<DOut>(dout) && pack4_aligned<DIn>(din)) {
    activation_backward4_kernel<kActivation, In, DOut, DIn>
        <<<flat_packs_grid(n, kBackwardPacks, amax), kThreads, 0, stream>>>(din, dout, in, n, amax);
  } else if (kRelu2) {
    relu2_backward_kernel<In, DOut, DIn><<<elements_grid(n, amax), kThreads, 0, stream>>>(din, dout, in, n, amax);
  } else {
    gelu_backward_kernel<In, DOut, DIn><<<elements_grid(n, amax), kThreads, 0, stream>>>(din, dout, in, n, amax);
  }
  check_launch(kRelu2 ? "relu2 backward" : "gelu backward");
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

// activation_backward_sums_kernel four columns per thread (width a multiple of 4 and every tensor
// pack-aligned, so no pack straddles SwiGLU's gate and up halves), the loads of kSumRows rows
// issued before their arithmetic, so a thread keeps them in flight (a thread per column and chunk
// waiting on one 2-byte load at a time leaves HBM mostly idle). Each column's fp32 gradients are
// still added one row after another in row order from zero: the same din, partial and amax. gate:
// a SwiGLU thread's columns are gate columns (else up columns, or GELU's or squared ReLU's).
constexpr int kSumRows = 4;

template <MlpActivation kActivation, typename DIn>
__global__ void activation_backward_sums4_kernel(DIn* __restrict__ din, float* __restrict__ partial,
                                                 const bf16* __restrict__ dout, const bf16* __restrict__ in,
                                                 int64_t rows, int64_t width, int64_t chunk, unsigned* amax) {
  constexpr bool kSwiglu = kActivation == MlpActivation::Swiglu;
  const int64_t in_width = kSwiglu ? 2 * width : width;
  const int64_t c = 4 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x), k = blockIdx.y;
  float m = 0.0f;
  if (c < in_width) {  // no early return: every thread reaches the block's amax barrier
    const bool gate = kSwiglu && c < width;
    const int64_t i = kSwiglu && !gate ? c - width : c;  // the feature: dout's column, SwiGLU's gate input's
    Pack4<bf16> x[kSumRows], u[kSumRows], dy[kSumRows];  // row j of a step: the input (gate), up, dout
    auto fetch = [&](int j, int64_t r) {
      x[j] = pack_at(in + r * in_width + i);
      if (gate) u[j] = pack_at(in + r * in_width + width + i);
      dy[j] = pack_at(dout + r * width + i);
    };
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto add = [&](int j, int64_t r) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float xv = load(x[j].v, e), d = load(dy[j].v, e);
        if constexpr (kSwiglu) {
          v[e] = gate ? swiglu_gate_grad(xv, load(u[j].v, e), d) : swiglu_up_grad(xv, d);
        } else {
          v[e] = flat_grad<kActivation>(xv, d);
        }
      }
      const float stored = store4(din + r * in_width + c, 0, v);
      if (amax != nullptr) m = nan_max(m, stored);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[e] = __fadd_rn(s[e], v[e]);
    };
    const int64_t last = min(rows, (k + 1) * chunk);
    int64_t r = k * chunk;
    for (; r + kSumRows <= last; r += kSumRows) {
#pragma unroll
      for (int j = 0; j < kSumRows; ++j) fetch(j, r + j);
#pragma unroll
      for (int j = 0; j < kSumRows; ++j) add(j, r + j);
    }
    for (; r < last; ++r) {
      fetch(0, r);
      add(0, r);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) partial[k * in_width + c + e] = s[e];
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
  launch_flat_forward<MlpActivation::Gelu>(out, in, n, nullptr, stream);
}

void gelu_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_flat_backward<MlpActivation::Gelu>(din, dout, in, n, nullptr, stream);
}

void relu2_forward(float* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_flat_forward<MlpActivation::Relu2>(out, in, n, nullptr, stream);
}

void relu2_backward(float* din, const float* dout, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_flat_backward<MlpActivation::Relu2>(din, dout, in, n, nullptr, stream);
}

namespace {
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
    launch_flat_forward<MlpActivation::Relu2>(out, in, n, amax, stream);
  } else {
    launch_flat_forward<MlpActivation::Gelu>(out, in, n, amax, stream);
  }
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
    launch_flat_backward<MlpActivation::Relu2>(din, dout, in, n, amax, stream);
  } else {
    launch_flat_backward<MlpActivation::Gelu>(din, dout, in, n, amax, stream);
  }
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
  if (width % 4 == 0 && pack4_aligned<bf16>(dout) && pack4_aligned<bf16>(in) && pack4_aligned<DIn>(din)) {
    // A thread per (four columns, chunk), the chunks along y as column_chunks' grid.
    const int64_t packs = in_width / 4, threads = std::min<int64_t>(kThreads, (packs + 31) / 32 * 32);
    const dim3 grid(static_cast<unsigned>((packs + threads - 1) / threads), l.grid.y);
    const auto launch = [&](auto kernel) {
      kernel<<<grid, static_cast<unsigned>(threads), 0, stream>>>(din, partial, dout, in, rows, width, l.chunk, amax);
    };
    if (activation == MlpActivation::Swiglu) {
      launch(activation_backward_sums4_kernel<MlpActivation::Swiglu, DIn>);
    } else if (activation == MlpActivation::Relu2) {
      launch(activation_backward_sums4_kernel<MlpActivation::Relu2, DIn>);
    } else {
      launch(activation_backward_sums4_kernel<MlpActivation::Gelu, DIn>);
    }
  } else {
    activation_backward_sums_kernel<DIn>
        <<<l.grid, kThreads, 0, stream>>>(activation, din, partial, dout, in, rows, width, l.chunk, amax);
  }
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
