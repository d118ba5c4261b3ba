#pragma once
// The chunk-parallel scan's backward element steps (kernels/ssd_chunks.h has the forward's and
// the notation): the gradients of kernels/cpu/ssd_scan.cpp's block_output_backward,
// advance_state_backward and dt_backward, per chunk instead of per block. With dS_out the
// gradient of the state a chunk leaves (the next chunk's total dS_in; zero after a row's last):
//   dS_in = (e dy)^T C + keep dS_out                       (walked from the last chunk back)
//   dx   += D dy + W^T dy + cs V            with V = B dS_out^T
//   dC   += e (dy S_in) + G B,  dB += G^T C + (cs x) dS_out,  G_ij = mask exp(cum_i - cum_j) dt_j (dy x^T)_ij
//   d(cum) and d(dt) per token from the same terms, then through cum's running sum to dt_raw, A_log.
// Every sum is in a fixed order (no atomics): a head's share of its group's dB and dC is kept
// apart and the shares added in head order, and the per-head parameters' partials are summed
// over the row-chunks in order.
#include "loom/kernels/ssd_chunks.h"

namespace loom::kernels::ssd_chunks {

// The scan's gradients (added into), as kernels/cpu/ssd_scan.h's backward takes them.
struct Grads {
  float *dx, *ddt_raw, *ddt_bias, *dA_log, *dB, *dC, *dD;
  const float* dy;
};

// Per (chunk-head, token, channel): dy (zeros on padding) and e dy.
template <typename Real>
struct GradRows {
  Dims d;
  Buffers<Real> w;
  GradBuffers<Real> g;
  Grads out;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const Dims::HeadElement e = d.head_element(k);
    const double v = d.valid(e.bc, e.i) ? out.dy[d.head_at(e, d.s.y_stride)] : 0.0;
    g.dY[k] = static_cast<Real>(v);
    g.Ye[k] = static_cast<Real>(w.e[e.ch * d.Q + e.i] * v);
  }
};

// Per (row, head of the slice, state element), from the last chunk back: S_local holds each
// chunk's (e dy)^T C on entry and its dS_out on return.
template <typename Real>
struct PassStateGradients {
  Dims d;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t size = d.states(), e = k % size, hl = (k / size) % d.heads_here(), b = k / (size * d.heads_here());
    double carry = 0.0;
    for (int64_t c = d.chunks - 1; c >= 0; --c) {
      const int64_t ch = (b * d.chunks + c) * d.heads_here() + hl;
      const double local = w.S_local[ch * size + e];
      w.S_local[ch * size + e] = static_cast<Real>(carry);
      carry = local + w.keep[ch] * carry;
    }
  }
};

// Per (chunk-head, column j): W and G down the column (zero where masked, so the GEMMs read them
// whole), and the column's sums: d(dt_j) += sum_i L_ij CB_ij DYX_ij, d(cum_j) -= sum_i W_ij DYX_ij.
template <typename Real>
struct QuadraticColumns {
  Dims d;
  Buffers<Real> w;
  GradBuffers<Real> g;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t Q = d.Q, j = k % Q, ch = k / Q;
    const Real* CB = w.CB + d.group_item_of(ch) * Q * Q;
    const double dt_j = w.dt[ch * Q + j];
    double ddt = 0.0, dcum = 0.0;
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t at = ch * Q * Q + i * Q + j;
      const double L = masked_decay(d, w, ch, i, j), dyx = g.DYX[at], cb = CB[i * Q + j];
      w.W[at] = static_cast<Real>(L * dt_j * cb);
      g.G[at] = static_cast<Real>(L * dt_j * dyx);
      ddt += L * cb * dyx;
      dcum += L * dt_j * cb * dyx;
    }
    g.col_ddt[k] = static_cast<Real>(ddt);
    g.col_dcum[k] = static_cast<Real>(dcum);
  }
};

// Per (chunk-head, row i): d(cum_i) += sum_j W_ij DYX_ij (after QuadraticColumns wrote W).
template <typename Real>
struct QuadraticRows {
  Dims d;
  Buffers<Real> w;
  GradBuffers<Real> g;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t Q = d.Q, i = k % Q, ch = k / Q;
    const Real* W = w.W + ch * Q * Q + i * Q;
    const Real* dyx = g.DYX + ch * Q * Q + i * Q;
    double sum = 0.0;
    for (int64_t j = 0; j <= i; ++j) sum += static_cast<double>(W[j]) * dyx[j];
    g.row_dcum[k] = static_cast<Real>(sum);
  }
};

// Per (chunk-head, token): C_i . (dy S_in)_i, x_i . V_i and dy_i . x_i.
template <typename Real>
struct RowDots {
  Dims d;
  Buffers<Real> w;
  GradBuffers<Real> g;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t P = d.s.head_dim, N = d.s.state, i = k % d.Q, ch = k / d.Q;
    const Real* C = w.Cd + (d.group_item_of(ch) * d.Q + i) * N;
    const Real* YS = g.YS + k * N;
    double state = 0.0, share = 0.0, dyx = 0.0;
    for (int64_t n = 0; n < N; ++n) state += static_cast<double>(YS[n]) * C[n];
    const Real *X = w.X + k * P, *V = w.U + k * P, *dY = g.dY + k * P;
    for (int64_t p = 0; p < P; ++p) {
      share += static_cast<double>(X[p]) * V[p];
      dyx += static_cast<double>(dY[p]) * X[p];
    }
    g.through_state[k] = static_cast<Real>(state);
    g.through_share[k] = static_cast<Real>(share);
    g.dy_x[k] = static_cast<Real>(dyx);
  }
};

// Per chunk-head: d(cum) and d(dt) per token, then through cum's running sum: d(dt_raw) added
// for its real tokens, and the partials of d(A_log), d(dt_bias) and d(D).
template <typename Real>
struct DtBackward {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  GradBuffers<Real> g;
  Grads out;
  LOOM_HOST_DEVICE void operator()(int64_t ch) const {
    const int64_t Q = d.Q, h = d.head_of(ch), bc = d.chunk_of(ch), at = ch * Q;
    const int32_t* z = w.starts + bc * Q;
    const double A = -exp(static_cast<double>(in.A_log[h])), last = w.cum[at + Q - 1];
    double into_last = static_cast<double>(w.keep[ch]) * g.dkeep[ch], dD = 0.0;
    for (int64_t j = 0; j < Q; ++j) into_last += w.cs[at + j] * g.through_share[at + j];
    double suffix = 0.0, dA = 0.0, d_bias = 0.0;
    for (int64_t j = Q - 1; j >= 0; --j) {
      const double cs = w.cs[at + j], share = g.through_share[at + j];
      double dcum = static_cast<double>(g.row_dcum[at + j]) - g.col_dcum[at + j] +
                    static_cast<double>(w.e[at + j]) * g.through_state[at + j] - cs * share;
      if (j == Q - 1) dcum += into_last;
      const double to_last = z[j] == z[Q - 1] ? exp(last - static_cast<double>(w.cum[at + j])) : 0.0;
      double ddt = g.col_ddt[at + j] + to_last * share;
      suffix += dcum;  // d(loss) / d(dt_j A)
      ddt += A * suffix;
      dA += w.dt[at + j] * suffix;
      dD += g.dy_x[at + j];
      if (!d.valid(bc, j)) continue;
      const int64_t raw_at = d.token_row(bc, j) * d.s.dt_stride + h;
      const double d_raw = ddt * sigmoid(static_cast<double>(in.dt_raw[raw_at]) + in.dt_bias[h]);
      out.ddt_raw[raw_at] += static_cast<float>(d_raw);
      d_bias += d_raw;
    }
    g.partials[ch * 3] = static_cast<Real>(dA * A);
    g.partials[ch * 3 + 1] = static_cast<Real>(d_bias);
    g.partials[ch * 3 + 2] = static_cast<Real>(dD);
  }
};

// Per (chunk-head, token, channel) of a real token: dx += D dy + W^T dy + cs V.
template <typename Real>
struct InputGradient {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  GradBuffers<Real> g;
  Grads out;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const Dims::HeadElement e = d.head_element(k);
    if (!d.valid(e.bc, e.i)) return;
    const double v = static_cast<double>(in.D[d.head_of(e.ch)]) * g.dY[k] + w.T[k] +
                     static_cast<double>(w.cs[e.ch * d.Q + e.i]) * w.U[k];
    out.dx[d.head_at(e, d.s.x_stride)] += static_cast<float>(v);
  }
};

// Per (chunk-group, token, state element) of a real token: the group's heads' shares of dB and dC
// added in head order, then into the gradients (a group taken in parts: into its sums so far,
// added into the gradients after its last part).
template <typename Real>
struct GroupGradients {
  Dims d;
  Buffers<Real> w;
  GradBuffers<Real> g;
  Grads out;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t N = d.s.state, n = k % N, i = (k / N) % d.Q, cg = k / (N * d.Q);
    const int64_t bc = cg / d.groups_here(), gl = cg % d.groups_here();
    if (!d.valid(bc, i)) return;
    double dB = 0.0, dC = 0.0;
    for (int64_t head = 0; head < d.group_heads(); ++head) {
      const int64_t ch = bc * d.heads_here() + gl * d.group_heads() + head, row = (ch * d.Q + i) * N + n;
      dB += g.dBh[row];
      dC += g.dCh[row] + static_cast<double>(w.e[ch * d.Q + i]) * g.YS[row];
    }
    const bool first_part = d.first_head % d.per_group == 0, last_part = (d.first_head + d.heads) % d.per_group == 0;
    if (!first_part) {
      dB += g.group_dB[k];
      dC += g.group_dC[k];
    }
    if (!last_part) {
      g.group_dB[k] = static_cast<Real>(dB);
      g.group_dC[k] = static_cast<Real>(dC);
      return;
    }
    const int64_t at = d.token_row(bc, i) * d.s.bc_stride + (d.first_group() + gl) * N + n;
    out.dB[at] += static_cast<float>(dB);
    out.dC[at] += static_cast<float>(dC);
  }
};

// Per head of the slice: its partials summed over the row-chunks in order.
template <typename Real>
struct HeadParameterGradients {
  Dims d;
  GradBuffers<Real> g;
  Grads out;
  LOOM_HOST_DEVICE void operator()(int64_t hl) const {
    double sums[3] = {0.0, 0.0, 0.0};
    for (int64_t bc = 0; bc < d.row_chunks(); ++bc)
      for (int c = 0; c < 3; ++c) sums[c] += g.partials[(bc * d.heads_here() + hl) * 3 + c];
    const int64_t h = d.first_head + hl;
    out.dA_log[h] += static_cast<float>(sums[0]);
    out.ddt_bias[h] += static_cast<float>(sums[1]);
    out.dD[h] += static_cast<float>(sums[2]);
  }
};

}  // namespace loom::kernels::ssd_chunks
