#pragma once
// What the scan's forward (ssd_scan.cu) and backward (ssd_scan_backward.cu) kernels share: a
// row's blocks (segments), one (row, head)'s view of the operands with its block's dt and running
// sum of dt * A in double, and the host steps that find the blocks and recompute the states.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/ssd_scan_work.h"
#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// The loops form's work arrays (kernels/ssd_scan_work.h).
using ssd_loops::block_dot_doubles;
using ssd_loops::entering_state_doubles;
using ssd_loops::forward_work;
using ssd_loops::forward_work_doubles;
using ssd_loops::head_bc_doubles;
using ssd_loops::head_partial_doubles;
using ssd_loops::head_work;
using ssd_loops::head_work_doubles;
using ssd_loops::longest_block;
using ssd_loops::state_slots;

struct ScanInputs {
  const float *x, *dt_raw, *dt_bias, *A_log, *B, *C, *D;
};

// Tokens [begin, end) of a row; starts_document: the state restarts at zero.
struct Segment {
  int64_t begin, end;
  bool starts_document;
  __device__ int64_t len() const { return end - begin; }
};

__device__ inline Segment segment_at(const int32_t* table, const SsdShape& s, int64_t b, int64_t i) {
  const int32_t* row = table + b * (s.seq + 1);
  return {row[i] / 2, row[i + 1] / 2, (row[i] & 1) != 0};
}

template <typename A, typename B>
__device__ inline double dot(const A* a, const B* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

// One (row, head): its operands, its scalars and its work arrays (device memory, [L] or [L, L]).
struct HeadScan {
  SsdShape s;
  ScanInputs in;
  int64_t row0, h, g;
  double A, D, dt_bias;
  double *S, *W, *dt, *cum, *coef;

  __device__ const float* x_at(int64_t t) const { return in.x + (row0 + t) * s.x_stride + h * s.head_dim; }
  __device__ const float* B_at(int64_t t) const { return in.B + (row0 + t) * s.bc_stride + g * s.state; }
  __device__ const float* C_at(int64_t t) const { return in.C + (row0 + t) * s.bc_stride + g * s.state; }
  __device__ double raw_at(int64_t t) const {
    return static_cast<double>(in.dt_raw[(row0 + t) * s.dt_stride + h]) + dt_bias;
  }
};

// `work`: forward_work(s) doubles (the state first).
__device__ inline HeadScan head_scan(const ScanInputs& in, const SsdShape& s, int64_t b, int64_t h, double* work) {
  const int64_t L = longest_block(s);
  HeadScan hs{s, in, b * s.seq, h, h / (s.heads / s.groups), -exp(static_cast<double>(in.A_log[h])),
              static_cast<double>(in.D[h]), static_cast<double>(in.dt_bias[h]), nullptr, nullptr, nullptr,
              nullptr, nullptr};
  hs.S = work;
  hs.W = hs.S + s.head_dim * s.state;
  hs.dt = hs.W + L * L;
  hs.cum = hs.dt + L;
  hs.coef = hs.cum + L;
  return hs;
}

// The block's dt = softplus(dt_raw + dt_bias) and its running sum of dt * A (in token order).
__device__ inline void load_block(const HeadScan& hs, const Segment& seg) {
  __syncthreads();  // the previous block's arrays are read no more
  for (int64_t i = threadIdx.x; i < seg.len(); i += blockDim.x) hs.dt[i] = softplus_of(hs.raw_at(seg.begin + i));
  __syncthreads();
  if (threadIdx.x == 0) {
    double run = 0.0;
    for (int64_t i = 0; i < seg.len(); ++i) {
      run += hs.dt[i] * hs.A;
      hs.cum[i] = run;
    }
  }
  __syncthreads();
}

struct RowSegments {
  int32_t *table, *counts;
};
// Finds every row's blocks (on the device, from the documents).
RowSegments row_segments(const SsdShape& s, const int32_t* documents, Scratch& scratch, cudaStream_t stream);
// C_t . B_j for every token t and each token j of t's block up to t, once per (row, group) (the
// group's heads share B and C): [batch, groups, seq, longest_block], row t's entry j - begin.
double* block_dots(const ScanInputs& in, const SsdShape& s, const RowSegments& segments, Scratch& scratch,
                   cudaStream_t stream);
// Token t's row of block_dots' array.
__device__ inline const double* dots_row(const double* dots, const SsdShape& s, int64_t b, int64_t g, int64_t t) {
  return dots + ((b * s.groups + g) * s.seq + t) * longest_block(s);
}
// A row's state before its first token and after its last ([batch, heads, head_dim, state] fp32;
// final may be initial): a prompt's chunk continuing a sequence. Null initial: zeros.
struct CarriedState {
  const float* initial = nullptr;
  float* final = nullptr;
};
// The forward walk: y when given, else the entering states into `entering` [batch, heads, slots,
// head_dim, state]; with `carried`, from and to those states.
void scan_states(float* y, double* entering, int64_t slots, const ScanInputs& in, const SsdShape& s,
                 const RowSegments& segments, Scratch& scratch, cudaStream_t stream, CarriedState carried = {});

}  // namespace loom::kernels::cuda
