#pragma once
// The chunk-parallel scan's forward and backward (kernels/ssd_chunks.h) for an executor `ex`:
//   ex.take<T>(n)        n Ts of work memory, held until the executor goes (not zeroed);
//   ex.each(n, step)     step(i) for every i in [0, n), in any order or at once;
//   ex.product(p)        the batched row-major GEMMs of a Product<Real>;
// each call ordered after the previous ones. `Real` is the work arrays' and products' type:
// double (as the CPU's scan) or float (the products on TF32 tensor cores on a GPU); every sum of
// an element step is in double either way. The heads are taken a slice at a time, as many whole
// groups per slice as `slice_bytes` of work memory hold, else part of a group (at least one
// head): the work arrays grow with tokens x heads x (head_dim + state + chunk), about 11 KB a
// token and head in the backward in double.
#include <algorithm>
#include <cstdint>

#include "loom/kernels/ssd_chunks.h"
#include "loom/kernels/ssd_chunks_backward.h"

namespace loom::kernels::ssd_chunks {

// The dimensions of the slices (the widest, first_head 0): as many whole groups as `slice_bytes`
// hold, else the most heads of one group that divide it and fit (at least one head).
template <typename Real>
Dims slice_dims(const SsdShape& s, bool backward, int64_t slice_bytes) {
  const int64_t Q = std::max<int64_t>(1, std::min(s.chunk, s.seq)), chunks = (s.seq + Q - 1) / Q;
  const int64_t per_group = s.heads / s.groups, row_chunks = s.batch * chunks;
  const auto bytes = [&](int64_t heads, int64_t groups) {
    return static_cast<int64_t>(sizeof(Real)) * row_chunks *
           (heads * head_elements(s, Q, backward) + groups * group_elements(s, Q, backward));
  };
  const int64_t groups = std::min(s.groups, slice_bytes / std::max<int64_t>(1, bytes(per_group, 1)));
  if (groups >= 1) return {s, Q, chunks, 0, groups * per_group, per_group};
  int64_t heads = 1;
  for (int64_t k = per_group; k > 1; --k) {
    if (per_group % k == 0 && bytes(k, 1) <= slice_bytes) {
      heads = k;
      break;
    }
  }
  return {s, Q, chunks, 0, heads, per_group};
}

// The slice of the heads from `first_head` (the last may hold fewer whole groups than the widest).
inline Dims slice_at(const Dims& widest, int64_t first_head) {
  Dims d = widest;
  d.first_head = first_head;
  d.heads = std::min(widest.heads, widest.s.heads - first_head);
  return d;
}

// The work arrays of the widest slice (`d`), carved from one allocation; a narrower slice uses
// their beginnings (every step indexes them by the slice's own counts).
template <typename Real, class Exec>
Buffers<Real> take_buffers(Exec& ex, const Dims& d, GradBuffers<Real>* grads) {
  const int64_t Q = d.Q, P = d.s.head_dim, N = d.s.state, heads = d.chunk_heads(), groups = d.chunk_groups();
  Real* next = ex.template take<Real>(heads * head_elements(d.s, Q, grads != nullptr) +
                                      groups * group_elements(d.s, Q, grads != nullptr));
  auto carve = [&](int64_t n) {
    Real* p = next;
    next += n;
    return p;
  };
  Buffers<Real> w{};
  w.starts = ex.template take<int32_t>(d.row_chunks() * Q);
  w.dt = carve(heads * Q), w.cum = carve(heads * Q), w.e = carve(heads * Q), w.cs = carve(heads * Q);
  w.keep = carve(heads);
  w.X = carve(heads * Q * P), w.Xc = carve(heads * Q * P), w.T = carve(heads * Q * P), w.U = carve(heads * Q * P);
  w.W = carve(heads * Q * Q);
  w.S_local = carve(heads * P * N), w.S_in = carve(heads * P * N);
  w.Bd = carve(groups * Q * N), w.Cd = carve(groups * Q * N), w.CB = carve(groups * Q * Q);
  if (grads == nullptr) return w;
  GradBuffers<Real>& g = *grads;
  g.dY = carve(heads * Q * P), g.Ye = carve(heads * Q * P);
  g.DYX = carve(heads * Q * Q), g.G = carve(heads * Q * Q);
  g.YS = carve(heads * Q * N), g.dCh = carve(heads * Q * N), g.dBh = carve(heads * Q * N);
  g.col_ddt = carve(heads * Q), g.col_dcum = carve(heads * Q), g.row_dcum = carve(heads * Q);
  g.through_state = carve(heads * Q), g.through_share = carve(heads * Q), g.dy_x = carve(heads * Q);
  g.dkeep = carve(heads), g.partials = carve(heads * 3);
  g.group_dB = carve(groups * Q * N), g.group_dC = carve(groups * Q * N);
  return w;
}

// A product over the slice's chunk-heads (or, with over_groups, its chunk-groups).
template <typename Real>
Product<Real> product(const Dims& d, bool over_groups, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                      Operand<Real> a, int64_t lda, Operand<Real> b, int64_t ldb, Operand<Real> c, int64_t ldc,
                      double beta = 0.0) {
  return {d, over_groups ? d.chunk_groups() : d.chunk_heads(), m, n, k, trans_a, trans_b, a, b, c, lda, ldb, ldc, beta};
}

// The slice's decays, dense rows, CB = C B^T, each chunk's own part of the leaving state
// S_local = (cs x)^T B, and the states entering every chunk (the row's final one into in.final).
template <typename Real, class Exec>
void chunk_states(Exec& ex, const Dims& d, const Inputs& in, const Buffers<Real>& w) {
  const int64_t Q = d.Q, P = d.s.head_dim, N = d.s.state;
  ex.each(d.chunk_heads(), Decays<Real>{d, in, w});
  ex.each(d.chunk_heads() * Q * P, HeadRows<Real>{d, in, w});
  ex.each(d.chunk_groups() * Q * N, GroupRows<Real>{d, in, w});
  ex.product(product<Real>(d, true, Q, Q, N, false, true, {w.Cd, Q * N}, N, {w.Bd, Q * N}, N, {w.CB, Q * Q}, Q));
  ex.product(product<Real>(d, false, P, N, Q, true, false, {w.Xc, Q * P}, P, {w.Bd, Q * N, true}, N,
                           {w.S_local, P * N}, N));
  ex.each(d.s.batch * d.heads_here() * P * N, PassStates<Real>{d, in, w});
}

// y of every real token (and in.final when given).
template <typename Real, class Exec>
void forward(Exec& ex, float* y, const Inputs& in, const SsdShape& s, int64_t slice_bytes) {
  if (s.batch * s.seq * s.heads == 0) return;
  const Dims widest = slice_dims<Real>(s, false, slice_bytes);
  const Buffers<Real> w = take_buffers<Real>(ex, widest, nullptr);
  ex.each(widest.row_chunks(), CountStarts{widest, in, w.starts});
  const int64_t Q = widest.Q, P = s.head_dim, N = s.state;
  for (int64_t h0 = 0; h0 < s.heads; h0 += widest.heads) {
    const Dims d = slice_at(widest, h0);
    chunk_states(ex, d, in, w);
    ex.each(d.chunk_heads() * Q * Q, QuadraticForm<Real>{d, w});
    ex.product(product<Real>(d, false, Q, P, N, false, true, {w.Cd, Q * N, true}, N, {w.S_in, P * N}, N,
                             {w.T, Q * P}, P));
    ex.product(product<Real>(d, false, Q, P, Q, false, false, {w.W, Q * Q}, Q, {w.X, Q * P}, P, {w.U, Q * P}, P));
    ex.each(d.chunk_heads() * Q * P, Outputs<Real>{d, in, w, y});
  }
}

// One slice's backward, its states already computed.
template <typename Real, class Exec>
void slice_backward(Exec& ex, const Dims& d, const Inputs& in, const Buffers<Real>& w, const GradBuffers<Real>& g,
                    const Grads& out) {
  const int64_t Q = d.Q, P = d.s.head_dim, N = d.s.state, heads = d.chunk_heads();
  ex.each(heads * Q * P, GradRows<Real>{d, w, g, out});
  ex.product(product<Real>(d, false, Q, Q, P, false, true, {g.dY, Q * P}, P, {w.X, Q * P}, P, {g.DYX, Q * Q}, Q));
  ex.product(product<Real>(d, false, Q, N, P, false, false, {g.dY, Q * P}, P, {w.S_in, P * N}, N, {g.YS, Q * N}, N));
  ex.product(product<Real>(d, false, P, N, Q, true, false, {g.Ye, Q * P}, P, {w.Cd, Q * N, true}, N,
                           {w.S_local, P * N}, N));
  ex.each(d.s.batch * d.heads_here() * P * N, PassStateGradients<Real>{d, w});  // S_local: dS_out now
  ex.product(product<Real>(d, false, 1, 1, P * N, false, false, {w.S_local, P * N}, P * N, {w.S_in, P * N}, 1,
                           {g.dkeep, 1}, 1));
  ex.each(heads * Q, QuadraticColumns<Real>{d, w, g});
  ex.each(heads * Q, QuadraticRows<Real>{d, w, g});
  ex.product(product<Real>(d, false, Q, P, Q, true, false, {w.W, Q * Q}, Q, {g.dY, Q * P}, P, {w.T, Q * P}, P));
  ex.product(product<Real>(d, false, Q, N, Q, false, false, {g.G, Q * Q}, Q, {w.Bd, Q * N, true}, N,
                           {g.dCh, Q * N}, N));
  ex.product(product<Real>(d, false, Q, N, Q, true, false, {g.G, Q * Q}, Q, {w.Cd, Q * N, true}, N, {g.dBh, Q * N}, N));
  ex.product(product<Real>(d, false, Q, N, P, false, false, {w.Xc, Q * P}, P, {w.S_local, P * N}, N, {g.dBh, Q * N}, N,
                           1.0));
  ex.product(product<Real>(d, false, Q, P, N, false, true, {w.Bd, Q * N, true}, N, {w.S_local, P * N}, N,
                           {w.U, Q * P}, P));
  ex.each(heads * Q, RowDots<Real>{d, w, g});
  ex.each(heads, DtBackward<Real>{d, in, w, g, out});
  ex.each(heads * Q * P, InputGradient<Real>{d, in, w, g, out});
  ex.each(d.chunk_groups() * Q * N, GroupGradients<Real>{d, w, g, out});
  ex.each(d.heads_here(), HeadParameterGradients<Real>{d, g, out});
}

// Every gradient added into (kernels/cpu/ssd_scan.h's backward); in.initial and in.final unused.
template <typename Real, class Exec>
void backward(Exec& ex, const Grads& out, Inputs in, const SsdShape& s, int64_t slice_bytes) {
  if (s.batch * s.seq * s.heads == 0) return;
  in.initial = nullptr;
  in.final = nullptr;
  const Dims widest = slice_dims<Real>(s, true, slice_bytes);
  GradBuffers<Real> g{};
  const Buffers<Real> w = take_buffers<Real>(ex, widest, &g);
  ex.each(widest.row_chunks(), CountStarts{widest, in, w.starts});
  for (int64_t h0 = 0; h0 < s.heads; h0 += widest.heads) {
    const Dims d = slice_at(widest, h0);
    chunk_states(ex, d, in, w);
    slice_backward(ex, d, in, w, g, out);
  }
}

}  // namespace loom::kernels::ssd_chunks
