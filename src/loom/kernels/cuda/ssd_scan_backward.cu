// The scan's backward (ssd_scan.h): the gradients of cpu/ssd_scan.cpp's block_output_backward,
// advance_state_backward and dt_backward, one thread block per (row, head), its phases split over
// the block's threads and separated by barriers; each head's share of its group's dB and dC is
// kept apart and a second kernel adds the group's shares in head order.
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/ssd_chunk_scan.h"
#include "loom/kernels/cuda/ssd_scan.h"
#include "loom/kernels/cuda/ssd_scan_blocks.cuh"

namespace loom::kernels::cuda {

namespace {

// A (row, head) block's work arrays: the head's state gradient carried from block to block, then
// per block the pair terms G, Q = W * dyx and R = L * cb * dyx ([L, L]), per-token d(dt),
// d(cum), exp(cum) and two scratch columns, and dy.dS_out B ([L, head_dim]).
struct HeadWork {
  double *carry, *G, *Q, *R, *ddt, *dcum, *decay, *tok, *tok2, *V, *head;
};

__device__ HeadWork head_arrays(const SsdShape& s, double* w) {
  const int64_t L = longest_block(s);
  HeadWork g{};
  g.carry = w;
  g.G = g.carry + s.head_dim * s.state;
  g.Q = g.G + L * L;
  g.R = g.Q + L * L;
  g.ddt = g.R + L * L;
  g.dcum = g.ddt + L;
  g.decay = g.dcum + L;
  g.tok = g.decay + L;
  g.tok2 = g.tok + L;
  g.V = g.tok2 + L;
  g.head = g.V + L * s.head_dim;
  return g;
}

// dB and dC: each head's share in double, [batch, heads, seq, state], summed by ssd_bc_sum_kernel.
struct ScanGrads {
  float *dx, *ddt_raw;
  double *dB, *dC;
  const float* dy;
};

// Per pair j <= i: W, G, Q, R (see HeadWork), cb = C_i . B_j from dots (the (row, group)'s part of
// block_dots' array); per token: coef_j = exp(cum_end - cum_j) dt_j and exp(cum_j).
__device__ void pair_terms(const HeadScan& hs, const Segment& seg, const HeadWork& hw, const float* dy,
                           const double* dots) {
  const int64_t len = seg.len(), P = hs.s.head_dim, width = longest_block(hs.s);
  for (int64_t k = threadIdx.x; k < len * len; k += blockDim.x) {
    const int64_t i = k / len, j = k % len;
    if (j > i) continue;
    const float* dyi = dy + (hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P;
    const double dyx = dot(dyi, hs.x_at(seg.begin + j), P), L = exp(hs.cum[i] - hs.cum[j]);
    const double cb = dots[(seg.begin + i) * width + j];
    hs.W[k] = L * hs.dt[j] * cb;
    hw.G[k] = L * hs.dt[j] * dyx;
    hw.Q[k] = hs.W[k] * dyx;
    hw.R[k] = L * cb * dyx;
  }
  const double last = hs.cum[len - 1];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    hs.coef[j] = exp(last - hs.cum[j]) * hs.dt[j];
    hw.decay[j] = exp(hs.cum[j]);
  }
  __syncthreads();
}

// Per token t: d(dt_t) and d(cum_t) of the quadratic form, d(cum_t) through the entering state S
// (null: zero), and dy_t . x_t (D's gradient) in tok.
__device__ void token_terms(const HeadScan& hs, const Segment& seg, const HeadWork& hw, const float* dy,
                            const double* S) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  for (int64_t t = threadIdx.x; t < len; t += blockDim.x) {
    double ddt = 0.0, dcum = 0.0;
    for (int64_t i = t; i < len; ++i) {
      ddt += hw.R[i * len + t];
      dcum -= hw.Q[i * len + t];
    }
    for (int64_t j = 0; j <= t; ++j) dcum += hw.Q[t * len + j];
    const float* dyt = dy + (hs.row0 + seg.begin + t) * hs.s.y_stride + hs.h * P;
    const float* Ct = hs.C_at(seg.begin + t);
    if (S) {
      double through = 0.0;
      for (int64_t p = 0; p < P; ++p) {
        double sc = 0.0;
        for (int64_t n = 0; n < N; ++n) sc += S[p * N + n] * Ct[n];
        through += dyt[p] * sc;
      }
      dcum += hw.decay[t] * through;
    }
    hw.ddt[t] = ddt;
    hw.dcum[t] = dcum;
    hw.tok[t] = dot(dyt, hs.x_at(seg.begin + t), P);
  }
  __syncthreads();
}

// dx of the block's tokens (added to the output once), and V = dS_out B_j per (j, p).
__device__ void dx_terms(const HeadScan& hs, const Segment& seg, const HeadWork& hw, const ScanGrads& out,
                         const double* dS_out) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  for (int64_t k = threadIdx.x; k < len * P; k += blockDim.x) {
    const int64_t j = k / P, p = k % P;
    const float* Bj = hs.B_at(seg.begin + j);
    double v = 0.0;
    for (int64_t n = 0; n < N; ++n) v += dS_out[p * N + n] * Bj[n];
    double dx = hs.D * out.dy[(hs.row0 + seg.begin + j) * hs.s.y_stride + hs.h * P + p] + hs.coef[j] * v;
    for (int64_t i = j; i < len; ++i)
      dx += hs.W[i * len + j] * out.dy[(hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P + p];
    out.dx[(hs.row0 + seg.begin + j) * hs.s.x_stride + hs.h * P + p] += static_cast<float>(dx);
    hw.V[k] = v;
  }
  __syncthreads();
}

// Through the state's coefficients: d(dt_j), d(cum_j) and (in tok2) the share of d(cum_end);
// the head's share of dC (per (i, n)) and dB (per (j, n)) into dB, dC ([seq, state]).
__device__ void bc_terms(const HeadScan& hs, const Segment& seg, const HeadWork& hw, const float* dy,
                         const double* S, const double* dS_out, double* dB, double* dC) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  const double last = hs.cum[len - 1];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double dcoeff = dot(hs.x_at(seg.begin + j), hw.V + j * P, P);
    hw.ddt[j] += exp(last - hs.cum[j]) * dcoeff;
    hw.dcum[j] -= hs.coef[j] * dcoeff;
    hw.tok2[j] = hs.coef[j] * dcoeff;
  }
  for (int64_t k = threadIdx.x; k < len * N; k += blockDim.x) {
    const int64_t i = k / N, n = k % N;
    const float* dyi = dy + (hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P;
    const float* xi = hs.x_at(seg.begin + i);
    double dc = 0.0, db = 0.0, sdy = 0.0, sx = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      if (S) sdy += S[p * N + n] * dyi[p];
      sx += dS_out[p * N + n] * xi[p];
    }
    dc = hw.decay[i] * sdy;
    for (int64_t j = 0; j <= i; ++j) dc += hw.G[i * len + j] * hs.B_at(seg.begin + j)[n];
    db = hs.coef[i] * sx;
    for (int64_t r = i; r < len; ++r) db += hw.G[r * len + i] * hs.C_at(seg.begin + r)[n];
    dC[seg.begin * N + k] = dc;
    dB[seg.begin * N + k] = db;
  }
  __syncthreads();
}

// dS_in = exp(cum_end) dS_out + sum_i exp(cum_i) dy_i C_i^T (zero at a document's start), in
// place; returns sum(dS_out * S) to every thread.
__device__ double carry_update(const HeadScan& hs, const Segment& seg, const HeadWork& hw, const float* dy,
                               const double* S, double* carry) {
  __shared__ double partial[kThreads];
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  const double keep = exp(hs.cum[len - 1]);
  double through = 0.0;
  for (int64_t k = threadIdx.x; k < P * N; k += blockDim.x) {
    const int64_t p = k / N, n = k % N;
    const double old = carry[k];
    if (S) through += old * S[k];
    double v = keep * old;
    for (int64_t i = 0; i < len; ++i)
      v += hw.decay[i] * dy[(hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P + p] *
           hs.C_at(seg.begin + i)[n];
    carry[k] = seg.starts_document ? 0.0 : v;
  }
  partial[threadIdx.x] = through;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();
  return total;
}

// cum -> dt * A -> softplus (dt_backward on the CPU): d(dt_raw) added to the output; the head's
// d(A_log), d(dt_bias), d(D) partials (part[0..2]) summed by thread 0 in token order.
__device__ void dt_terms(const HeadScan& hs, const Segment& seg, const HeadWork& hw, double through,
                         double* part, float* ddt_raw) {
  const int64_t len = seg.len();
  if (threadIdx.x == 0) {
    double end = exp(hs.cum[len - 1]) * through;
    for (int64_t j = 0; j < len; ++j) end += hw.tok2[j];
    hw.dcum[len - 1] += end;
    double suffix = 0.0, dA = 0.0, dD = 0.0;
    for (int64_t j = len - 1; j >= 0; --j) {
      suffix += hw.dcum[j];
      hw.ddt[j] += hs.A * suffix;
      dA += hs.dt[j] * suffix;
    }
    for (int64_t t = 0; t < len; ++t) dD += hw.tok[t];
    part[0] += dA * hs.A;
    part[2] += dD;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double d_raw = hw.ddt[j] * sigmoid_of(hs.raw_at(seg.begin + j));
    ddt_raw[(hs.row0 + seg.begin + j) * hs.s.dt_stride + hs.h] += static_cast<float>(d_raw);
    hw.tok2[j] = d_raw;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t j = 0; j < len; ++j) sum += hw.tok2[j];
    part[1] += sum;
  }
  __syncthreads();
}

// One head's gradients over one block, given its entering state S (null: zero) and the state's
// gradient carried from the next block; dots: the (row, group)'s C.B; dB, dC: the head's shares
// ([seq, state]).
__device__ void head_block_backward(const HeadScan& hs, const Segment& seg, const HeadWork& hw,
                                    const ScanGrads& out, const double* dots, const double* S, double* carry,
                                    double* part, double* dB, double* dC) {
  load_block(hs, seg);
  pair_terms(hs, seg, hw, out.dy, dots);
  token_terms(hs, seg, hw, out.dy, S);
  dx_terms(hs, seg, hw, out, carry);
  bc_terms(hs, seg, hw, out.dy, S, carry, dB, dC);
  const double through = carry_update(hs, seg, hw, out.dy, S, carry);
  dt_terms(hs, seg, hw, through, part, out.ddt_raw);
}

// One thread block per (row, head): the row's blocks backwards; dots: block_dots' array;
// entering: the states scan_states recomputed; partials: [batch, heads, 3].
__global__ void ssd_backward_kernel(ScanGrads out, double* partials, const double* dots, const double* entering,
                                    int64_t slots, ScanInputs in, SsdShape s, const int32_t* __restrict__ table,
                                    const int32_t* __restrict__ counts, double* work) {
  const int64_t b = blockIdx.x / s.heads, h = blockIdx.x % s.heads;
  const int64_t PN = s.head_dim * s.state, bh = b * s.heads + h;
  const HeadWork hw = head_arrays(s, work + blockIdx.x * head_work(s));
  const HeadScan hs = head_scan(in, s, b, h, hw.head);  // its own state slot unused
  const double* group_dots = dots_row(dots, s, b, hs.g, 0);
  double* dB = out.dB + bh * s.seq * s.state;
  double* dC = out.dC + bh * s.seq * s.state;
  for (int64_t k = threadIdx.x; k < PN; k += blockDim.x) hw.carry[k] = 0.0;
  for (int64_t k = threadIdx.x; k < 3; k += blockDim.x) partials[bh * 3 + k] = 0.0;
  int64_t slot = 0;
  for (int32_t i = 0; i < counts[b]; ++i) slot += segment_at(table, s, b, i).starts_document ? 0 : 1;
  for (int32_t i = counts[b] - 1; i >= 0; --i) {
    const Segment seg = segment_at(table, s, b, i);
    if (!seg.starts_document) --slot;
    const double* S = seg.starts_document ? nullptr : entering + (bh * slots + slot) * PN;
    head_block_backward(hs, seg, hw, out, group_dots, S, hw.carry, partials + bh * 3, dB, dC);
  }
}

// dB and dC: per (row, token, group, state element) the group's heads' shares added in head order
// (the CPU's order), then added to the output once.
__global__ void ssd_bc_sum_kernel(float* dB, float* dC, const double* dB_heads, const double* dC_heads, SsdShape s) {
  const int64_t per_group = s.heads / s.groups, N = s.state, step = s.seq * N;
  for (int64_t r = blockIdx.y; r < s.batch * s.seq; r += gridDim.y) {
    const int64_t b = r / s.seq, t = r % s.seq;
    for (int64_t c = column_start(); c < s.groups * N; c += column_stride()) {
      const int64_t g = c / N, n = c % N;
      const int64_t first = ((b * s.heads + g * per_group) * s.seq + t) * N + n;
      double db = 0.0, dc = 0.0;
      for (int64_t k = 0; k < per_group; ++k) {
        db += dB_heads[first + k * step];
        dc += dC_heads[first + k * step];
      }
      dB[r * s.bc_stride + c] += static_cast<float>(db);
      dC[r * s.bc_stride + c] += static_cast<float>(dc);
    }
  }
}

// The per-head parameter gradients: each head's partials summed over the rows in order.
__global__ void ssd_head_params_kernel(float* dA_log, float* ddt_bias, float* dD, const double* partials, SsdShape s) {
  for (int64_t h = grid_start(); h < s.heads; h += grid_stride()) {
    double sums[3] = {0.0, 0.0, 0.0};
    for (int64_t b = 0; b < s.batch; ++b)
      for (int c = 0; c < 3; ++c) sums[c] += partials[(b * s.heads + h) * 3 + c];
    dA_log[h] += static_cast<float>(sums[0]);
    ddt_bias[h] += static_cast<float>(sums[1]);
    dD[h] += static_cast<float>(sums[2]);
  }
}

}  // namespace

void ssd_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC, float* dD,
                       const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                       const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                       const int32_t* documents, cudaStream_t stream) {
  if (s.batch * s.seq * s.heads == 0) return;
  if (ssd_scan_in_chunks())
    return ssd_chunk_scan_backward(dx, ddt_raw, ddt_bias, dA_log, dB, dC, dD, dy, x, dt_raw, dt_bias, A_log, B, C, D,
                                   s, documents, stream);
  Scratch scratch;
  const ScanInputs in{x, dt_raw, dt_bias, A_log, B, C, D};
  const RowSegments segments = row_segments(s, documents, scratch, stream);
  const int64_t slots = state_slots(s);
  double* entering = scratch.of<double>(entering_state_doubles(s));
  scan_states(nullptr, entering, slots, in, s, segments, scratch, stream);
  const double* dots = block_dots(in, s, segments, scratch, stream);
  double* partials = scratch.of<double>(head_partial_doubles(s));
  double* work = scratch.of<double>(head_work_doubles(s));
  // Every token of every (row, head) is in one block, so the shares are written whole.
  double* dB_heads = scratch.of<double>(head_bc_doubles(s));
  double* dC_heads = scratch.of<double>(head_bc_doubles(s));
  ssd_backward_kernel<<<static_cast<unsigned>(s.batch * s.heads), kThreads, 0, stream>>>(
      {dx, ddt_raw, dB_heads, dC_heads, dy}, partials, dots, entering, slots, in, s, segments.table,
      segments.counts, work);
  check_launch("ssd_backward_kernel");
  const RowsLaunch sum = launch_over_rows(s.batch * s.seq, s.groups * s.state);
  ssd_bc_sum_kernel<<<sum.grid, sum.block, 0, stream>>>(dB, dC, dB_heads, dC_heads, s);
  check_launch("ssd_bc_sum_kernel");
  ssd_head_params_kernel<<<grid_for(s.heads), kThreads, 0, stream>>>(dA_log, ddt_bias, dD, partials, s);
  check_launch("ssd_head_params_kernel");
}

}  // namespace loom::kernels::cuda
