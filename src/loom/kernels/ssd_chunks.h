#pragma once
// Mamba-2's scan (kernels/cpu/ssd_scan.h) in the chunk-parallel form of the SSD algorithm (Dao and
// Gu, "Transformers are SSMs", 2024): every row is cut into chunks of Q tokens from its start (Q
// the shape's chunk, at most seq; the last chunk padded with zero tokens), the products of all
// chunks run at once as batched GEMMs, and only the [head_dim, state] states pass from chunk to
// chunk in order, an element-wise walk. It is written once for an executor (kernels/
// ssd_chunks_scan.h) that runs element steps over index ranges and batched row-major GEMMs, in
// double or in float (`Real`: the work arrays' and products' type; the element steps sum in
// double either way): the CUDA backend's (kernels/cuda/ssd_chunk_scan.cu: one thread per index,
// cuBLAS's batched DGEMMs or TF32 GEMMs) and a host one in the tests, which holds this form to
// the CPU's scan.
//
// Documents packed in a row restart the state at their first token. With z_i the number of
// document starts among the chunk's tokens up to i (equal for two tokens of one document), a
// token sees the earlier tokens of the chunk with its z only, the entering state only while
// z_i = 0, and a chunk passes on the entering state only when it holds no start, only its last
// document's tokens. The CPU cuts its blocks at document starts instead: the same sums in
// another order: in double, as the CPU's, the fp32 results agree to about an ulp.
//
// Per chunk and head (ch), with cum_i the running sum of dt A over the chunk and CB = C B^T:
//   W_ij  = [j <= i][z_i = z_j] exp(cum_i - cum_j) dt_j CB_ij     (the quadratic form)
//   e_i   = [z_i = 0] exp(cum_i)                                  (the entering state's decay)
//   cs_j  = [z_j = z_last] exp(cum_last - cum_j) dt_j             (a token's share of the leaving state)
//   keep  = [z_last = 0] exp(cum_last)
//   y     = D x + diag(e) C S_in^T + W x,   S_out = keep S_in + (cs x)^T B.
#include <cmath>
#include <cstdint>

#include "loom/kernels/host_device.h"
#include "loom/kernels/types.h"

namespace loom::kernels::ssd_chunks {

// The scan's operands (kernels/cpu/ssd_scan.h), the documents ([batch, seq] ids or null), and a
// carried state ([batch, heads, head_dim, state] fp32; null initial: zeros and token 0 starts a
// document; final, when given, may be initial).
struct Inputs {
  const float *x, *dt_raw, *dt_bias, *A_log, *B, *C, *D;
  const int32_t* documents;
  const float* initial;
  float* final;
};

// One pass over a slice of the heads, [first_head, first_head + heads), in the order of the model's:
// whole groups, or part of one group (`heads` then divides the group's; the group's B and C are
// made again for each part).
struct Dims {
  SsdShape s;
  int64_t Q, chunks;  // tokens per chunk, chunks per row
  int64_t first_head, heads, per_group;

  LOOM_HOST_DEVICE int64_t heads_here() const { return heads; }
  // The slice's heads of one group, its groups, and its first group in the model.
  LOOM_HOST_DEVICE int64_t group_heads() const { return heads < per_group ? heads : per_group; }
  LOOM_HOST_DEVICE int64_t groups_here() const { return heads / group_heads(); }
  LOOM_HOST_DEVICE int64_t first_group() const { return first_head / per_group; }
  LOOM_HOST_DEVICE int64_t row_chunks() const { return s.batch * chunks; }
  LOOM_HOST_DEVICE int64_t chunk_heads() const { return row_chunks() * heads; }
  LOOM_HOST_DEVICE int64_t chunk_groups() const { return row_chunks() * groups_here(); }
  LOOM_HOST_DEVICE int64_t states() const { return s.head_dim * s.state; }
  // Chunk-head ch: its row-chunk and its head in the model.
  LOOM_HOST_DEVICE int64_t chunk_of(int64_t ch) const { return ch / heads; }
  LOOM_HOST_DEVICE int64_t head_of(int64_t ch) const { return first_head + ch % heads; }
  // The chunk-group that chunk-head ch reads B and C from.
  LOOM_HOST_DEVICE int64_t group_item_of(int64_t ch) const {
    return chunk_of(ch) * groups_here() + (ch % heads) / group_heads();
  }
  // Token i of row-chunk bc: its index in the row (seq or beyond: padding) and in [batch * seq].
  LOOM_HOST_DEVICE int64_t token_in_row(int64_t bc, int64_t i) const { return (bc % chunks) * Q + i; }
  LOOM_HOST_DEVICE int64_t token_row(int64_t bc, int64_t i) const {
    return (bc / chunks) * s.seq + token_in_row(bc, i);
  }
  LOOM_HOST_DEVICE bool valid(int64_t bc, int64_t i) const { return token_in_row(bc, i) < s.seq; }

  // Element k of a [chunk_heads, Q, head_dim] work array: its chunk-head, token, channel and
  // row-chunk; and where that element lives in a [batch * seq, stride] tensor of the heads' rows.
  struct HeadElement {
    int64_t ch, i, p, bc;
  };
  LOOM_HOST_DEVICE HeadElement head_element(int64_t k) const {
    const int64_t ch = k / (s.head_dim * Q);
    return {ch, (k / s.head_dim) % Q, k % s.head_dim, chunk_of(ch)};
  }
  LOOM_HOST_DEVICE int64_t head_at(const HeadElement& e, int64_t stride) const {
    return token_row(e.bc, e.i) * stride + head_of(e.ch) * s.head_dim + e.p;
  }
};

// The work arrays of one slice, in Real but `starts` (int32, [row_chunks, Q], for every slice).
// Per chunk-head: dt, cum, e, cs [Q]; keep; x and cs x [Q, head_dim]; W [Q, Q]; S_local (the
// chunk's own part of the leaving state; in the backward then the leaving state's gradient) and
// S_in [head_dim, state]; T = C S_in^T and U = W x [Q, head_dim] (in the backward W^T dy and
// B dS_out^T). Per chunk-group: B, C [Q, state] and CB [Q, Q].
template <typename Real>
struct Buffers {
  int32_t* starts;
  Real *dt, *cum, *e, *cs, *keep;
  Real *X, *Xc, *W, *S_local, *S_in, *T, *U;
  Real *Bd, *Cd, *CB;
};

// The backward's further arrays: dy and e dy, dy x^T and the quadratic form's gradient G [Q, Q],
// dy S_in [Q, state], each head's share of dB and dC [Q, state], per token sums [Q] (the
// quadratic form's d(dt) and d(cum) by column and by row, C . dy S_in, x . V, dy . x), per
// chunk-head the leaving state's <dS_out, S_in> and the (dA_log, dt_bias, D) partial sums, and
// per chunk-group dB and dC summed over the heads of the group's slices so far (a group taken in
// parts: its gradients are added once, after its last part).
template <typename Real>
struct GradBuffers {
  Real *dY, *Ye, *DYX, *G, *YS, *dCh, *dBh;
  Real *col_ddt, *col_dcum, *row_dcum, *through_state, *through_share, *dy_x;
  Real *dkeep, *partials;
  Real *group_dB, *group_dC;  // per chunk-group [Q, state]: a group's sums over the slices before
};

// Elements per chunk-head and per chunk-group of a slice (Buffers; with GradBuffers for the backward).
LOOM_HOST_DEVICE inline int64_t head_elements(const SsdShape& s, int64_t Q, bool backward) {
  const int64_t P = s.head_dim, N = s.state;
  const int64_t forward = 4 * Q + 1 + 4 * Q * P + Q * Q + 2 * P * N;
  return forward + (backward ? 2 * Q * P + 2 * Q * Q + 3 * Q * N + 6 * Q + 4 : 0);
}
LOOM_HOST_DEVICE inline int64_t group_elements(const SsdShape& s, int64_t Q, bool backward) {
  return (backward ? 4 : 2) * Q * s.state + Q * Q;
}

LOOM_HOST_DEVICE inline double softplus(double v) { return v > 20.0 ? v : log1p(exp(v)); }
LOOM_HOST_DEVICE inline double sigmoid(double v) { return 1.0 / (1.0 + exp(-v)); }

// --- Element steps (each an index range's functor; kernels/ssd_chunks_scan.h runs them in order).

// Per row-chunk: z_i, the document starts among its tokens up to i.
struct CountStarts {
  Dims d;
  Inputs in;
  int32_t* starts;
  LOOM_HOST_DEVICE void operator()(int64_t bc) const {
    const int32_t* doc = in.documents ? in.documents + (bc / d.chunks) * d.s.seq : nullptr;
    int32_t count = 0;
    for (int64_t i = 0; i < d.Q; ++i) {
      const int64_t t = d.token_in_row(bc, i);
      if (t < d.s.seq) {
        const bool starts_document = t == 0 ? in.initial == nullptr : doc != nullptr && doc[t] != doc[t - 1];
        count += starts_document ? 1 : 0;
      }
      starts[bc * d.Q + i] = count;
    }
  }
};

// Per chunk-head: dt (zero on padding), cum, e, cs and keep.
template <typename Real>
struct Decays {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t ch) const {
    const int64_t h = d.head_of(ch), bc = d.chunk_of(ch), Q = d.Q;
    const double A = -exp(static_cast<double>(in.A_log[h])), bias = in.dt_bias[h];
    Real* dt = w.dt + ch * Q;
    Real* cum = w.cum + ch * Q;
    double run = 0.0;
    for (int64_t i = 0; i < Q; ++i) {
      dt[i] = static_cast<Real>(
          d.valid(bc, i) ? softplus(in.dt_raw[d.token_row(bc, i) * d.s.dt_stride + h] + bias) : 0.0);
      run += dt[i] * A;
      cum[i] = static_cast<Real>(run);
    }
    const int32_t* z = w.starts + bc * Q;
    const double last = cum[Q - 1];
    w.keep[ch] = static_cast<Real>(z[Q - 1] == 0 ? exp(last) : 0.0);
    for (int64_t i = 0; i < Q; ++i) {
      w.e[ch * Q + i] = static_cast<Real>(z[i] == 0 ? exp(static_cast<double>(cum[i])) : 0.0);
      w.cs[ch * Q + i] = static_cast<Real>(z[i] == z[Q - 1] ? exp(last - cum[i]) * dt[i] : 0.0);
    }
  }
};

// Per (chunk-head, token, channel): x and cs x, dense (zeros on padding).
template <typename Real>
struct HeadRows {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const Dims::HeadElement e = d.head_element(k);
    const double v = d.valid(e.bc, e.i) ? static_cast<double>(in.x[d.head_at(e, d.s.x_stride)]) : 0.0;
    w.X[k] = static_cast<Real>(v);
    w.Xc[k] = static_cast<Real>(w.cs[e.ch * d.Q + e.i] * v);
  }
};

// Per (chunk-group, token, state element): B and C, dense (zeros on padding).
template <typename Real>
struct GroupRows {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t N = d.s.state, n = k % N, i = (k / N) % d.Q, cg = k / (N * d.Q);
    const int64_t bc = cg / d.groups_here(), g = d.first_group() + cg % d.groups_here();
    const bool valid = d.valid(bc, i);
    const int64_t at = d.token_row(bc, i) * d.s.bc_stride + g * N + n;
    w.Bd[k] = valid ? static_cast<Real>(in.B[at]) : Real(0);
    w.Cd[k] = valid ? static_cast<Real>(in.C[at]) : Real(0);
  }
};

// L_ij = [j <= i][z_i = z_j] exp(cum_i - cum_j): W's decay and mask.
template <typename Real>
LOOM_HOST_DEVICE double masked_decay(const Dims& d, const Buffers<Real>& w, int64_t ch, int64_t i, int64_t j) {
  const int32_t* z = w.starts + d.chunk_of(ch) * d.Q;
  if (j > i || z[i] != z[j]) return 0.0;
  const Real* cum = w.cum + ch * d.Q;
  return exp(static_cast<double>(cum[i]) - cum[j]);
}

// Per (chunk-head, i, j): the quadratic form W.
template <typename Real>
struct QuadraticForm {
  Dims d;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t Q = d.Q, j = k % Q, i = (k / Q) % Q, ch = k / (Q * Q);
    const double L = masked_decay(d, w, ch, i, j);
    w.W[k] = static_cast<Real>(L == 0.0 ? 0.0 : L * w.dt[ch * Q + j] * w.CB[d.group_item_of(ch) * Q * Q + i * Q + j]);
  }
};

// Per (row, head of the slice, state element): the states in chunk order. S_in of each chunk is
// written; S_local is the chunk's own part of the state it leaves. The row's final state into
// in.final when given (each element read from in.initial before it is written).
template <typename Real>
struct PassStates {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const int64_t size = d.states(), e = k % size, hl = (k / size) % d.heads_here(), b = k / (size * d.heads_here());
    const int64_t h = d.first_head + hl, carried = (b * d.s.heads + h) * size + e;
    double S = in.initial ? static_cast<double>(in.initial[carried]) : 0.0;
    for (int64_t c = 0; c < d.chunks; ++c) {
      const int64_t ch = (b * d.chunks + c) * d.heads_here() + hl;
      w.S_in[ch * size + e] = static_cast<Real>(S);
      S = w.keep[ch] * S + w.S_local[ch * size + e];
    }
    if (in.final) in.final[carried] = static_cast<float>(S);
  }
};

// Per (chunk-head, token, channel) of a real token: y = D x + e_i T + U.
template <typename Real>
struct Outputs {
  Dims d;
  Inputs in;
  Buffers<Real> w;
  float* y;
  LOOM_HOST_DEVICE void operator()(int64_t k) const {
    const Dims::HeadElement e = d.head_element(k);
    if (!d.valid(e.bc, e.i)) return;
    const double v = static_cast<double>(in.D[d.head_of(e.ch)]) * w.X[k] +
                     static_cast<double>(w.e[e.ch * d.Q + e.i]) * w.T[k] + w.U[k];
    y[d.head_at(e, d.s.y_stride)] = static_cast<float>(v);
  }
};

// --- Batched products: for i in [0, count), C_i = op(A_i) op(B_i) + beta C_i, row-major
// (op(A_i) [m, k], op(B_i) [k, n]; leading dimensions lda, ldb, ldc).

// Operand i of a product: base + i * size, or, for a per-group operand of a product over
// chunk-heads, the chunk-head's group's item.
template <typename Real>
struct Operand {
  Real* base;
  int64_t size;
  bool group_of_head = false;
};

template <typename Real>
struct Product {
  Dims d;
  int64_t count, m, n, k;
  bool trans_a, trans_b;
  Operand<Real> a, b, c;
  int64_t lda, ldb, ldc;
  double beta = 0.0;
};

template <typename Real>
LOOM_HOST_DEVICE Real* operand_at(const Product<Real>& p, const Operand<Real>& o, int64_t i) {
  return o.base + (o.group_of_head ? p.d.group_item_of(i) : i) * o.size;
}

// A row-major product as a column-major BLAS call (cuBLAS's): row-major C = op(A) op(B) is
// column-major C^T = op(B)^T op(A)^T, so the call's first operand is B, its second A, with the
// widths swapped. The CUDA executor calls cuBLAS with these; the tests' host executor calls a
// column-major dgemm / sgemm with them, which holds the mapping to the CPU's scan.
struct ColumnMajorCall {
  bool trans_first, trans_second;  // op of the call's first operand (B) and second (A)
  int64_t m, n, k, ld_first, ld_second, ldc;
};
template <typename Real>
ColumnMajorCall column_major(const Product<Real>& p) {
  return {p.trans_b, p.trans_a, p.n, p.m, p.k, p.ldb, p.lda, p.ldc};
}

}  // namespace loom::kernels::ssd_chunks
