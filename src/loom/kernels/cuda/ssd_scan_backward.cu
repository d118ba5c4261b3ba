// The scan's backward (ssd_scan.h): the gradients of cpu/ssd_scan.cpp's block_output_backward,
// advance_state_backward and dt_backward, one thread block per (row, group), its phases split
// over the block's threads and separated by barriers.
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/ssd_scan.h"
#include "loom/kernels/cuda/ssd_scan_blocks.cuh"

namespace loom::kernels::cuda {

namespace {

// A (row, group) block's work arrays: each head's state gradient carried from block to block,
// then per block C.B, the pair terms G, Q = W * dyx and R = L * cb * dyx ([L, L]), per-token
// d(dt), d(cum), exp(cum) and two scratch columns, dy.dS_out B ([L, head_dim]) and the group's
// dB, dC.
struct GroupWork {
  double *carry, *cb, *G, *Q, *R, *ddt, *dcum, *decay, *tok, *tok2, *V, *dB, *dC, *head;
};

__host__ __device__ int64_t group_work(const SsdShape& s) {
  const int64_t L = longest_block(s), per_group = s.heads / s.groups;
  return per_group * s.head_dim * s.state + 4 * L * L + 5 * L + L * s.head_dim + 2 * L * s.state + forward_work(s);
}

__device__ GroupWork group_arrays(const SsdShape& s, double* w) {
  const int64_t L = longest_block(s), per_group = s.heads / s.groups;
  GroupWork g{};
  g.carry = w;
  g.cb = g.carry + per_group * s.head_dim * s.state;
  g.G = g.cb + L * L;
  g.Q = g.G + L * L;
  g.R = g.Q + L * L;
  g.ddt = g.R + L * L;
  g.dcum = g.ddt + L;
  g.decay = g.dcum + L;
  g.tok = g.decay + L;
  g.tok2 = g.tok + L;
  g.V = g.tok2 + L;
  g.dB = g.V + L * s.head_dim;
  g.dC = g.dB + L * s.state;
  g.head = g.dC + L * s.state;
  return g;
}

struct ScanGrads {
  float *dx, *ddt_raw, *dB, *dC;
  const float* dy;
};

// C_i . B_j (j <= i), shared by the group's heads; the group's dB and dC zeroed.
__device__ void block_cb(const HeadScan& hs, const Segment& seg, const GroupWork& gw) {
  const int64_t len = seg.len(), N = hs.s.state;
  for (int64_t k = threadIdx.x; k < len * len; k += blockDim.x) {
    const int64_t i = k / len, j = k % len;
    if (j <= i) gw.cb[k] = dot(hs.C_at(seg.begin + i), hs.B_at(seg.begin + j), N);
  }
  for (int64_t k = threadIdx.x; k < len * N; k += blockDim.x) gw.dB[k] = gw.dC[k] = 0.0;
  __syncthreads();
}

// Per pair j <= i: W, G, Q, R (see GroupWork); per token: coef_j = exp(cum_end - cum_j) dt_j and
// exp(cum_j).
__device__ void pair_terms(const HeadScan& hs, const Segment& seg, const GroupWork& gw, const float* dy) {
  const int64_t len = seg.len(), P = hs.s.head_dim;
  for (int64_t k = threadIdx.x; k < len * len; k += blockDim.x) {
    const int64_t i = k / len, j = k % len;
    if (j > i) continue;
    const float* dyi = dy + (hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P;
    const double dyx = dot(dyi, hs.x_at(seg.begin + j), P), L = exp(hs.cum[i] - hs.cum[j]);
    hs.W[k] = L * hs.dt[j] * gw.cb[k];
    gw.G[k] = L * hs.dt[j] * dyx;
    gw.Q[k] = hs.W[k] * dyx;
    gw.R[k] = L * gw.cb[k] * dyx;
  }
  const double last = hs.cum[len - 1];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    hs.coef[j] = exp(last - hs.cum[j]) * hs.dt[j];
    gw.decay[j] = exp(hs.cum[j]);
  }
  __syncthreads();
}

// Per token t: d(dt_t) and d(cum_t) of the quadratic form, d(cum_t) through the entering state S
// (null: zero), and dy_t . x_t (D's gradient) in tok.
__device__ void token_terms(const HeadScan& hs, const Segment& seg, const GroupWork& gw, const float* dy,
                            const double* S) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  for (int64_t t = threadIdx.x; t < len; t += blockDim.x) {
    double ddt = 0.0, dcum = 0.0;
    for (int64_t i = t; i < len; ++i) {
      ddt += gw.R[i * len + t];
      dcum -= gw.Q[i * len + t];
    }
    for (int64_t j = 0; j <= t; ++j) dcum += gw.Q[t * len + j];
    const float* dyt = dy + (hs.row0 + seg.begin + t) * hs.s.y_stride + hs.h * P;
    const float* Ct = hs.C_at(seg.begin + t);
    if (S) {
      double through = 0.0;
      for (int64_t p = 0; p < P; ++p) {
        double sc = 0.0;
        for (int64_t n = 0; n < N; ++n) sc += S[p * N + n] * Ct[n];
        through += dyt[p] * sc;
      }
      dcum += gw.decay[t] * through;
    }
    gw.ddt[t] = ddt;
    gw.dcum[t] = dcum;
    gw.tok[t] = dot(dyt, hs.x_at(seg.begin + t), P);
  }
  __syncthreads();
}

// dx of the block's tokens (added to the output once), and V = dS_out B_j per (j, p).
__device__ void dx_terms(const HeadScan& hs, const Segment& seg, const GroupWork& gw, const ScanGrads& out,
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
    gw.V[k] = v;
  }
  __syncthreads();
}

// Through the state's coefficients: d(dt_j), d(cum_j) and (in tok2) the share of d(cum_end);
// the group's dC (per (i, n)) and dB (per (j, n)).
__device__ void bc_terms(const HeadScan& hs, const Segment& seg, const GroupWork& gw, const float* dy,
                         const double* S, const double* dS_out) {
  const int64_t len = seg.len(), P = hs.s.head_dim, N = hs.s.state;
  const double last = hs.cum[len - 1];
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double dcoeff = dot(hs.x_at(seg.begin + j), gw.V + j * P, P);
    gw.ddt[j] += exp(last - hs.cum[j]) * dcoeff;
    gw.dcum[j] -= hs.coef[j] * dcoeff;
    gw.tok2[j] = hs.coef[j] * dcoeff;
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
    dc = gw.decay[i] * sdy;
    for (int64_t j = 0; j <= i; ++j) dc += gw.G[i * len + j] * hs.B_at(seg.begin + j)[n];
    db = hs.coef[i] * sx;
    for (int64_t r = i; r < len; ++r) db += gw.G[r * len + i] * hs.C_at(seg.begin + r)[n];
    gw.dC[k] += dc;
    gw.dB[k] += db;
  }
  __syncthreads();
}

// dS_in = exp(cum_end) dS_out + sum_i exp(cum_i) dy_i C_i^T (zero at a document's start), in
// place; returns sum(dS_out * S) to every thread.
__device__ double carry_update(const HeadScan& hs, const Segment& seg, const GroupWork& gw, const float* dy,
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
      v += gw.decay[i] * dy[(hs.row0 + seg.begin + i) * hs.s.y_stride + hs.h * P + p] *
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
__device__ void dt_terms(const HeadScan& hs, const Segment& seg, const GroupWork& gw, double through,
                         double* part, float* ddt_raw) {
  const int64_t len = seg.len();
  if (threadIdx.x == 0) {
    double end = exp(hs.cum[len - 1]) * through;
    for (int64_t j = 0; j < len; ++j) end += gw.tok2[j];
    gw.dcum[len - 1] += end;
    double suffix = 0.0, dA = 0.0, dD = 0.0;
    for (int64_t j = len - 1; j >= 0; --j) {
      suffix += gw.dcum[j];
      gw.ddt[j] += hs.A * suffix;
      dA += hs.dt[j] * suffix;
    }
    for (int64_t t = 0; t < len; ++t) dD += gw.tok[t];
    part[0] += dA * hs.A;
    part[2] += dD;
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
    const double d_raw = gw.ddt[j] * sigmoid_of(hs.raw_at(seg.begin + j));
    ddt_raw[(hs.row0 + seg.begin + j) * hs.s.dt_stride + hs.h] += static_cast<float>(d_raw);
    gw.tok2[j] = d_raw;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int64_t j = 0; j < len; ++j) sum += gw.tok2[j];
    part[1] += sum;
  }
  __syncthreads();
}

// One head's gradients over one block, given its entering state S (null: zero) and the state's
// gradient carried from the next block.
__device__ void head_block_backward(const HeadScan& hs, const Segment& seg, const GroupWork& gw,
                                    const ScanGrads& out, const double* S, double* carry, double* part) {
  load_block(hs, seg);
  pair_terms(hs, seg, gw, out.dy);
  token_terms(hs, seg, gw, out.dy, S);
  dx_terms(hs, seg, gw, out, carry);
  bc_terms(hs, seg, gw, out.dy, S, carry);
  const double through = carry_update(hs, seg, gw, out.dy, S, carry);
  dt_terms(hs, seg, gw, through, part, out.ddt_raw);
}

// One thread block per (row, group): the row's blocks backwards, each through the group's heads
// in order; entering: the states scan_states recomputed; partials: [batch, heads, 3].
__global__ void ssd_backward_kernel(ScanGrads out, double* partials, const double* entering, int64_t slots,
                                    ScanInputs in, SsdShape s, const int32_t* __restrict__ table,
                                    const int32_t* __restrict__ counts, double* work) {
  const int64_t b = blockIdx.x / s.groups, g = blockIdx.x % s.groups, per_group = s.heads / s.groups;
  const int64_t PN = s.head_dim * s.state, N = s.state;
  const GroupWork gw = group_arrays(s, work + blockIdx.x * group_work(s));
  for (int64_t k = threadIdx.x; k < per_group * PN; k += blockDim.x) gw.carry[k] = 0.0;
  for (int64_t k = threadIdx.x; k < per_group * 3; k += blockDim.x) partials[(b * s.heads + g * per_group) * 3 + k] = 0.0;
  int64_t slot = 0;
  for (int32_t i = 0; i < counts[b]; ++i) slot += segment_at(table, s, b, i).starts_document ? 0 : 1;
  for (int32_t i = counts[b] - 1; i >= 0; --i) {
    const Segment seg = segment_at(table, s, b, i);
    if (!seg.starts_document) --slot;
    __syncthreads();
    block_cb(head_scan(in, s, b, g * per_group, gw.head), seg, gw);
    for (int64_t k = 0; k < per_group; ++k) {
      const int64_t h = g * per_group + k;
      const HeadScan hs = head_scan(in, s, b, h, gw.head);  // its own state slot unused
      const double* S = seg.starts_document ? nullptr : entering + ((b * s.heads + h) * slots + slot) * PN;
      head_block_backward(hs, seg, gw, out, S, gw.carry + k * PN, partials + (b * s.heads + h) * 3);
    }
    for (int64_t k = threadIdx.x; k < seg.len() * N; k += blockDim.x) {
      const int64_t at = (b * s.seq + seg.begin + k / N) * s.bc_stride + g * N + k % N;
      out.dB[at] += static_cast<float>(gw.dB[k]);
      out.dC[at] += static_cast<float>(gw.dC[k]);
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
  Scratch scratch;
  const ScanInputs in{x, dt_raw, dt_bias, A_log, B, C, D};
  const RowSegments segments = row_segments(s, documents, scratch, stream);
  const int64_t slots = state_slots(s);
  double* entering = scratch.of<double>(s.batch * s.heads * slots * s.head_dim * s.state);
  scan_states(nullptr, entering, slots, in, s, segments, scratch, stream);
  double* partials = scratch.of<double>(s.batch * s.heads * 3);
  double* work = scratch.of<double>(s.batch * s.groups * group_work(s));
  ssd_backward_kernel<<<static_cast<unsigned>(s.batch * s.groups), kThreads, 0, stream>>>(
      {dx, ddt_raw, dB, dC, dy}, partials, entering, slots, in, s, segments.table, segments.counts, work);
  check_launch("ssd_backward_kernel");
  ssd_head_params_kernel<<<grid_for(s.heads), kThreads, 0, stream>>>(dA_log, ddt_bias, dD, partials, s);
  check_launch("ssd_head_params_kernel");
}

}  // namespace loom::kernels::cuda
