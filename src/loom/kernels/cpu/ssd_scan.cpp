#include "loom/kernels/cpu/ssd_scan.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

// Everything inside a block is accumulated in double: the chunked scan must agree with the
// token-by-token recurrence to fp32 rounding whatever the block size. Every product of a block
// (C B^T, the quadratic form, the state's terms, and their gradients) is one dgemm on dense
// double copies of the block's rows; only the elementwise terms are loops.

namespace loom::kernels::cpu {
namespace {

struct Segment {
  int64_t begin, end;  // tokens [begin, end) of the row
  bool starts_document;
};

// The row's blocks: at most s.chunk tokens, cut again at every document boundary.
std::vector<Segment> segments_of_row(const SsdShape& s, int64_t b, const int32_t* documents) {
  std::vector<Segment> out;
  const int32_t* doc = documents ? documents + b * s.seq : nullptr;
  int64_t begin = 0;
  bool starts = true;
  for (int64_t t = 1; t <= s.seq; ++t) {
    const bool boundary = t < s.seq && doc && doc[t] != doc[t - 1];
    if (t == s.seq || boundary || t - begin == s.chunk) {
      out.push_back({begin, t, starts});
      begin = t;
      starts = boundary;
    }
  }
  return out;
}

double softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Pointers of one (row, head) and the block's per-token dt and running sum of dt * A.
struct HeadBlock {
  const SsdShape* s;
  int64_t row0;  // b * seq
  int64_t h, g;
  const float *x, *dt_raw;
  double A, D, dt_bias;
  std::vector<double> dt, cum;

  double raw_at(int64_t t) const { return dt_raw[(row0 + t) * s->dt_stride + h] + dt_bias; }

  std::vector<double> step_decay;  // exp(dt_i A): exp(cum_i - cum_{i-1})

  void load(const Segment& seg) {
    const int64_t len = seg.end - seg.begin;
    dt.assign(len, 0.0);
    cum.assign(len, 0.0);
    step_decay.assign(len, 0.0);
    double run = 0.0;
    for (int64_t i = 0; i < len; ++i) {
      dt[i] = softplus(raw_at(seg.begin + i));
      run += dt[i] * A;
      cum[i] = run;
      step_decay[i] = std::exp(dt[i] * A);
    }
  }
  // Row i of the block's decays, decay[j] = exp(cum_i - cum_j) for j <= i, from row i - 1 (the
  // i entries `decay` holds; none for i = 0): that row times the step's decay exp(dt_i A), one
  // vector multiplication a row instead of an exp an entry. Every factor is in (0, 1], so the
  // products only shrink, and their rounding stays far below fp32's.
  void next_decays(int64_t i, std::vector<double>& decay) const {
    decay.resize(static_cast<size_t>(i + 1));
    double* d = decay.data();
    const double step = step_decay[static_cast<size_t>(i)];
#pragma omp simd
    for (int64_t j = 0; j < i; ++j) d[j] *= step;
    d[i] = 1.0;
  }
};

HeadBlock head_block(const SsdShape& s, int64_t b, int64_t h, const float* x, const float* dt_raw,
                     const float* dt_bias, const float* A_log, const float* D) {
  const int64_t g = h / (s.heads / s.groups);
  return {&s, b * s.seq, h, g, x, dt_raw, -std::exp(static_cast<double>(A_log[h])),
          static_cast<double>(D[h]), static_cast<double>(dt_bias[h]), {}, {}, {}};
}

// c = beta c + op(a) op(b), row-major doubles [m, n] (OpenBLAS): op(a) is [m, k], op(b) [k, n].
void product(double* c, const double* a, bool trans_a, const double* b, bool trans_b, int64_t m, int64_t n, int64_t k,
             double beta) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a,
              static_cast<int>(trans_a ? m : k), b, static_cast<int>(trans_b ? k : n), beta, c, static_cast<int>(n));
}

// A block's rows as a dense [len, width] double matrix (rows of `base` at `stride`, from `col`).
void block_rows(std::vector<double>& out, const float* base, int64_t stride, int64_t row0, int64_t col, int64_t len,
                int64_t width) {
  out.resize(static_cast<size_t>(len * width));
  for (int64_t i = 0; i < len; ++i)
    for (int64_t c = 0; c < width; ++c) out[i * width + c] = base[(row0 + i) * stride + col + c];
}

// A block's B and C rows of one group, dense ([len, state] each), and with `with_cb`
// cb = C B^T ([len, len]: cb[i, j] = C_i . B_j; only j <= i is read), shared by the group's heads.
struct GroupBlock {
  std::vector<double> Bm, Cm, cb;
  void load(const SsdShape& s, const float* B, const float* C, int64_t row0, int64_t g, const Segment& seg,
            bool with_cb) {
    const int64_t len = seg.end - seg.begin, N = s.state;
    block_rows(Bm, B, s.bc_stride, row0 + seg.begin, g * N, len, N);
    block_rows(Cm, C, s.bc_stride, row0 + seg.begin, g * N, len, N);
    if (!with_cb) return;
    cb.resize(static_cast<size_t>(len * len));
    product(cb.data(), Cm.data(), false, Bm.data(), true, len, len, N, 0.0);
  }
};

// The block's x rows of the head, dense [len, head_dim].
void head_rows(std::vector<double>& X, const HeadBlock& hb, const Segment& seg) {
  block_rows(X, hb.x, hb.s->x_stride, hb.row0 + seg.begin, hb.h * hb.s->head_dim, seg.end - seg.begin,
             hb.s->head_dim);
}

// W[i, j] = exp(cum_i - cum_j) dt_j cb[i, j] for j <= i, 0 above: the block's quadratic form.
void quadratic_form(std::vector<double>& W, const HeadBlock& hb, const std::vector<double>& cb, int64_t len) {
  W.assign(static_cast<size_t>(len * len), 0.0);
  std::vector<double> decays;
  const double* dt = hb.dt.data();
  for (int64_t i = 0; i < len; ++i) {
    hb.next_decays(i, decays);
    const double* L = decays.data();
    const double* cb_row = cb.data() + i * len;
    double* W_row = W.data() + i * len;
#pragma omp simd
    for (int64_t j = 0; j <= i; ++j) W_row[j] = L[j] * dt[j] * cb_row[j];
  }
}

// S <- exp(cum_end) S + sum_j exp(cum_end - cum_j) dt_j x_j B_j^T: S = exp(cum_end) S + X^T Bc
// with Bc_j = exp(cum_end - cum_j) dt_j B_j.
void advance_state(std::vector<double>& S, const HeadBlock& hb, const std::vector<double>& X, const GroupBlock& gb,
                   const Segment& seg) {
  const int64_t len = seg.end - seg.begin, P = hb.s->head_dim, N = hb.s->state;
  const double last = hb.cum[len - 1];
  for (double& v : S) v *= std::exp(last);
  std::vector<double> Bc(static_cast<size_t>(len * N));
  for (int64_t j = 0; j < len; ++j) {
    const double coeff = std::exp(last - hb.cum[j]) * hb.dt[j];
    for (int64_t n = 0; n < N; ++n) Bc[j * N + n] = coeff * gb.Bm[j * N + n];
  }
  product(S.data(), X.data(), true, Bc.data(), false, P, N, len, 1.0);
}

// y over the block from the entering state S ([head_dim, state]) and the block's own tokens:
// y = D x + diag(exp(cum)) C S^T + W X.
void block_output(float* y, const SsdShape& s, const HeadBlock& hb, const std::vector<double>& X,
                  const GroupBlock& gb, const Segment& seg, const std::vector<double>& S) {
  const int64_t len = seg.end - seg.begin, P = s.head_dim, N = s.state;
  std::vector<double> W, out(static_cast<size_t>(len * P));
  quadratic_form(W, hb, gb.cb, len);
  product(out.data(), gb.Cm.data(), false, S.data(), true, len, P, N, 0.0);
  for (int64_t i = 0; i < len; ++i) {
    const double decay = std::exp(hb.cum[i]);
    for (int64_t p = 0; p < P; ++p) out[i * P + p] *= decay;
  }
  product(out.data(), W.data(), false, X.data(), false, len, P, len, 1.0);
  for (int64_t i = 0; i < len; ++i) {
    float* yi = y + (hb.row0 + seg.begin + i) * s.y_stride + hb.h * P;
    for (int64_t p = 0; p < P; ++p) yi[p] = static_cast<float>(hb.D * X[i * P + p] + out[i * P + p]);
  }
}

// Gradients of one (head, block), accumulated in double: dx, dB, dC of the block's tokens
// ([len, head_dim] / [len, state]), d(dt) and d(cum) per token.
struct BlockGrads {
  std::vector<double> dx, dB, dC, ddt, dcum;
  void reset(int64_t len, int64_t P, int64_t N, bool group_too) {
    dx.assign(len * P, 0.0);
    ddt.assign(len, 0.0);
    dcum.assign(len, 0.0);
    if (group_too) {
      dB.assign(len * N, 0.0);
      dC.assign(len * N, 0.0);
    }
  }
};

// Gradients through y = D x + diag(exp(cum)) C S_in^T + W x. dD summed into *dD. Through the
// state: with YS = dy S_in, dC_i += exp(cum_i) YS_i and dS_in += (diag(exp(cum)) dy)^T C. The
// quadratic form is three products: with DYX = dy x^T and G_ij = L_ij dt_j DYX_ij (j <= i),
// dx += W^T dy, dC += G B and dB += G^T C.
void block_output_backward(BlockGrads& gr, std::vector<double>& dS_in, double* dD, const float* dy,
                           const HeadBlock& hb, const std::vector<double>& X, const GroupBlock& gb, const Segment& seg,
                           const std::vector<double>& S) {
  const SsdShape& s = *hb.s;
  const int64_t len = seg.end - seg.begin, P = s.head_dim, N = s.state;
  std::vector<double> Y, decays;
  block_rows(Y, dy, s.y_stride, hb.row0 + seg.begin, hb.h * P, len, P);
  std::vector<double> dyx(static_cast<size_t>(len * len)), W(dyx.size(), 0.0), G(dyx.size(), 0.0);
  product(dyx.data(), Y.data(), false, X.data(), true, len, len, P, 0.0);
  std::vector<double> YS(static_cast<size_t>(len * N)), Yd(static_cast<size_t>(len * P));
  product(YS.data(), Y.data(), false, S.data(), false, len, N, P, 0.0);
  for (int64_t i = 0; i < len; ++i) {
    const double decay = std::exp(hb.cum[i]);
    double through_state = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      const double dyp = Y[i * P + p];
      *dD += dyp * X[i * P + p];
      gr.dx[i * P + p] += hb.D * dyp;
      Yd[i * P + p] = decay * dyp;
    }
    for (int64_t n = 0; n < N; ++n) {
      gr.dC[i * N + n] += decay * YS[i * N + n];
      through_state += YS[i * N + n] * gb.Cm[i * N + n];
    }
    gr.dcum[i] += decay * through_state;
    // Row i of the quadratic form: W and G, and d(cum) through W_ij's factor exp(cum_i - cum_j):
    // + W_ij dyx_ij to cum_i, - the same to cum_j (both to cum_i at j = i: they cancel).
    hb.next_decays(i, decays);
    const double *L = decays.data(), *dt = hb.dt.data(), *cb_row = gb.cb.data() + i * len;
    const double* dyx_row = dyx.data() + i * len;
    double *W_row = W.data() + i * len, *G_row = G.data() + i * len, *ddt = gr.ddt.data(), *dcum = gr.dcum.data();
    double into_i = 0.0;
#pragma omp simd reduction(+ : into_i)
    for (int64_t j = 0; j <= i; ++j) {
      const double w = L[j] * dt[j] * cb_row[j], wd = w * dyx_row[j];
      W_row[j] = w;
      G_row[j] = L[j] * dt[j] * dyx_row[j];
      ddt[j] += L[j] * cb_row[j] * dyx_row[j];
      into_i += wd;
      dcum[j] -= wd;
    }
    dcum[i] += into_i;
  }
  product(dS_in.data(), Yd.data(), true, gb.Cm.data(), false, P, N, len, 1.0);
  product(gr.dx.data(), W.data(), true, Y.data(), false, len, P, len, 1.0);
  product(gr.dC.data(), G.data(), false, gb.Bm.data(), false, len, N, len, 1.0);
  product(gr.dB.data(), G.data(), true, gb.Cm.data(), false, len, N, len, 1.0);
}

// Gradients through S_out = exp(cum_end) S_in + sum_j c_j x_j B_j^T (c_j = exp(cum_end - cum_j)
// dt_j), given dS_out: with V = B dS_out^T and XD = x dS_out, dx_j += c_j V_j, dB_j += c_j XD_j
// and d c_j = x_j . V_j.
void advance_state_backward(BlockGrads& gr, std::vector<double>& dS_in, const std::vector<double>& dS_out,
                            const HeadBlock& hb, const std::vector<double>& X, const GroupBlock& gb,
                            const Segment& seg, const std::vector<double>& S) {
  const int64_t len = seg.end - seg.begin, P = hb.s->head_dim, N = hb.s->state;
  const double last = hb.cum[len - 1], keep = std::exp(last);
  double through_state = 0.0;
  for (int64_t i = 0; i < P * N; ++i) {
    dS_in[i] += keep * dS_out[i];
    through_state += dS_out[i] * S[i];
  }
  gr.dcum[len - 1] += keep * through_state;
  std::vector<double> V(static_cast<size_t>(len * P)), XD(static_cast<size_t>(len * N));
  product(V.data(), gb.Bm.data(), false, dS_out.data(), true, len, P, N, 0.0);
  product(XD.data(), X.data(), false, dS_out.data(), false, len, N, P, 0.0);
  for (int64_t j = 0; j < len; ++j) {
    const double decay = std::exp(last - hb.cum[j]), coeff = decay * hb.dt[j];
    double dcoeff = 0.0;
    for (int64_t p = 0; p < P; ++p) {
      dcoeff += X[j * P + p] * V[j * P + p];
      gr.dx[j * P + p] += coeff * V[j * P + p];
    }
    for (int64_t n = 0; n < N; ++n) gr.dB[j * N + n] += coeff * XD[j * N + n];
    gr.ddt[j] += decay * dcoeff;
    gr.dcum[len - 1] += coeff * dcoeff;
    gr.dcum[j] -= coeff * dcoeff;
  }
}

// cum -> dt * A -> softplus: d(dt_raw) per token (added to ddt_raw); d(A_log), d(dt_bias) summed
// into the head's partials.
void dt_backward(float* ddt_raw, double* dA_log, double* ddt_bias, BlockGrads& gr, const HeadBlock& hb,
                 const Segment& seg) {
  const int64_t len = seg.end - seg.begin;
  double suffix = 0.0, dA = 0.0;
  for (int64_t j = len - 1; j >= 0; --j) {
    suffix += gr.dcum[j];  // d(loss)/d(dt_j A)
    gr.ddt[j] += hb.A * suffix;
    dA += hb.dt[j] * suffix;
  }
  *dA_log += dA * hb.A;
  for (int64_t j = 0; j < len; ++j) {
    const double d_raw = gr.ddt[j] * sigmoid(hb.raw_at(seg.begin + j));
    ddt_raw[(hb.row0 + seg.begin + j) * hb.s->dt_stride + hb.h] += static_cast<float>(d_raw);
    *ddt_bias += d_raw;
  }
}

// out[(row0 + i) * stride + col + c] += v[i, c] (a block's gradient into its rows).
void add_block(float* out, int64_t stride, int64_t row0, int64_t col, const std::vector<double>& v, int64_t len,
               int64_t width) {
  for (int64_t i = 0; i < len; ++i)
    for (int64_t c = 0; c < width; ++c) out[(row0 + i) * stride + col + c] += static_cast<float>(v[i * width + c]);
}

}  // namespace

namespace {

// The chunked scan of every row from `initial` ([batch, heads, head_dim, state]; null: zeros, and
// then the row's first block starts a document as any other) to, when `final` is given, each
// row's state after its last token written there (it may be `initial`: each (row, group) reads
// its heads' states before it writes them).
void chunked_scan(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                  const float* B, const float* C, const float* D, const SsdShape& s, const int32_t* documents,
                  const float* initial, float* final) {
  const int64_t per_group = s.heads / s.groups, state_size = s.head_dim * s.state;
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.groups; ++g) {
      std::vector<HeadBlock> heads;
      for (int64_t k = 0; k < per_group; ++k)
        heads.push_back(head_block(s, b, g * per_group + k, x, dt_raw, dt_bias, A_log, D));
      std::vector<std::vector<double>> states(per_group, std::vector<double>(state_size, 0.0));
      if (initial) {
        for (int64_t k = 0; k < per_group; ++k) {
          const float* from = initial + (b * s.heads + g * per_group + k) * state_size;
          std::copy(from, from + state_size, states[k].begin());
        }
      }
      GroupBlock gb;
      std::vector<double> X;
      for (const Segment& seg : segments_of_row(s, b, documents)) {
        gb.load(s, B, C, b * s.seq, g, seg, true);
        const bool restart = seg.starts_document && !(initial && seg.begin == 0);
        for (int64_t k = 0; k < per_group; ++k) {
          if (restart) std::fill(states[k].begin(), states[k].end(), 0.0);
          heads[k].load(seg);
          head_rows(X, heads[k], seg);
          block_output(y, s, heads[k], X, gb, seg, states[k]);
          advance_state(states[k], heads[k], X, gb, seg);
        }
      }
      if (final) {
        for (int64_t k = 0; k < per_group; ++k) {
          float* to = final + (b * s.heads + g * per_group + k) * state_size;
          for (int64_t i = 0; i < state_size; ++i) to[i] = static_cast<float>(states[k][i]);
        }
      }
    }
  }
}

}  // namespace

void ssd_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                      const float* B, const float* C, const float* D, const SsdShape& s, const int32_t* documents) {
  chunked_scan(y, x, dt_raw, dt_bias, A_log, B, C, D, s, documents, nullptr, nullptr);
}

namespace {

// The entering state of every block of a row for each head of the group (recomputed forward),
// [block, head of the group, head_dim, state].
std::vector<double> entering_states(const SsdShape& s, std::vector<HeadBlock>& heads, const float* B, const float* C,
                                    int64_t b, int64_t g, const std::vector<Segment>& segs) {
  const int64_t per_group = static_cast<int64_t>(heads.size()), state_size = s.head_dim * s.state;
  std::vector<double> out(segs.size() * per_group * state_size);
  std::vector<std::vector<double>> states(per_group, std::vector<double>(state_size, 0.0));
  GroupBlock gb;
  std::vector<double> X;
  for (size_t i = 0; i < segs.size(); ++i) {
    gb.load(s, B, C, b * s.seq, g, segs[i], false);
    for (int64_t k = 0; k < per_group; ++k) {
      std::vector<double>& S = states[k];
      if (segs[i].starts_document) std::fill(S.begin(), S.end(), 0.0);
      std::copy(S.begin(), S.end(), out.begin() + (i * per_group + k) * state_size);
      heads[k].load(segs[i]);
      head_rows(X, heads[k], segs[i]);
      advance_state(S, heads[k], X, gb, segs[i]);
    }
  }
  return out;
}

}  // namespace

void ssd_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC, float* dD,
                       const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                       const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                       const int32_t* documents) {
  const int64_t per_group = s.heads / s.groups, P = s.head_dim, N = s.state, state_size = P * N;
  std::vector<double> partial(s.batch * s.heads * 3, 0.0);  // per (row, head): dA_log, dt_bias, D
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t g = 0; g < s.groups; ++g) {
      std::vector<HeadBlock> heads;
      for (int64_t k = 0; k < per_group; ++k)
        heads.push_back(head_block(s, b, g * per_group + k, x, dt_raw, dt_bias, A_log, D));
      const std::vector<Segment> segs = segments_of_row(s, b, documents);
      const std::vector<double> entering = entering_states(s, heads, B, C, b, g, segs);
      std::vector<std::vector<double>> carry(per_group, std::vector<double>(state_size, 0.0));
      std::vector<double> X, dS_in(state_size);
      GroupBlock gb;
      BlockGrads gr;
      for (int64_t i = static_cast<int64_t>(segs.size()) - 1; i >= 0; --i) {
        const Segment& seg = segs[i];
        const int64_t len = seg.end - seg.begin;
        gb.load(s, B, C, b * s.seq, g, seg, true);
        gr.reset(len, P, N, true);
        for (int64_t k = 0; k < per_group; ++k) {
          HeadBlock& hb = heads[k];
          double* part = &partial[(b * s.heads + hb.h) * 3];
          const std::vector<double> S(entering.begin() + (i * per_group + k) * state_size,
                                      entering.begin() + (i * per_group + k + 1) * state_size);
          hb.load(seg);
          head_rows(X, hb, seg);
          gr.reset(len, P, N, false);
          std::fill(dS_in.begin(), dS_in.end(), 0.0);
          block_output_backward(gr, dS_in, part + 2, dy, hb, X, gb, seg, S);
          advance_state_backward(gr, dS_in, carry[k], hb, X, gb, seg, S);
          dt_backward(ddt_raw, part, part + 1, gr, hb, seg);
          add_block(dx, s.x_stride, hb.row0 + seg.begin, hb.h * P, gr.dx, len, P);
          if (seg.starts_document) std::fill(dS_in.begin(), dS_in.end(), 0.0);
          carry[k] = dS_in;
        }
        add_block(dB, s.bc_stride, b * s.seq + seg.begin, g * N, gr.dB, len, N);
        add_block(dC, s.bc_stride, b * s.seq + seg.begin, g * N, gr.dC, len, N);
      }
    }
  }
  for (int64_t h = 0; h < s.heads; ++h) {
    double sums[3] = {0.0, 0.0, 0.0};
    for (int64_t b = 0; b < s.batch; ++b)
      for (int c = 0; c < 3; ++c) sums[c] += partial[(b * s.heads + h) * 3 + c];
    dA_log[h] += static_cast<float>(sums[0]);
    ddt_bias[h] += static_cast<float>(sums[1]);
    dD[h] += static_cast<float>(sums[2]);
  }
}

void ssd_scan_step(float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s) {
  if (s.seq > 1) return chunked_scan(y, x, dt_raw, dt_bias, A_log, B, C, D, s, nullptr, state, state);
  const int64_t P = s.head_dim, N = s.state, per_group = s.heads / s.groups;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / per_group;
      const double dt = softplus(static_cast<double>(dt_raw[b * s.dt_stride + h]) + dt_bias[h]);
      const double decay = std::exp(-std::exp(static_cast<double>(A_log[h])) * dt);
      const float* xh = x + b * s.x_stride + h * P;
      const float* Bg = B + b * s.bc_stride + g * N;
      const float* Cg = C + b * s.bc_stride + g * N;
      float* S = state + ((slots ? slots[b] : b) * s.heads + h) * P * N;
      float* yh = y + b * s.y_stride + h * P;
      for (int64_t p = 0; p < P; ++p) {
        double acc = static_cast<double>(D[h]) * xh[p];
        for (int64_t n = 0; n < N; ++n) {
          const double v = decay * S[p * N + n] + dt * xh[p] * Bg[n];
          S[p * N + n] = static_cast<float>(v);
          acc += v * Cg[n];
        }
        yh[p] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace loom::kernels::cpu
