// Mamba-2's kernels: the chunked scan against the token-by-token recurrence (forward and
// backward, any block size, packed documents), and every backward against finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../gradient_check.h"
#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/causal_conv.h"
#include "loom/kernels/cpu/gated_norm.h"
#include "loom/kernels/cpu/ssd_scan.h"

namespace loom::kernels::cpu {
namespace {

using loom::testing::expect_gradient_matches;
using loom::testing::random_vector;
using loom::testing::weighted_sum;

// A scan problem: x has two padding columns per row (strided), B and C share one [rows, 2 G N].
struct Problem {
  SsdShape s;
  std::vector<float> x, dt, dt_bias, A_log, BC, D, dy;
  std::vector<int32_t> docs;
  float* B() { return BC.data(); }
  float* C() { return BC.data() + s.groups * s.state; }
  int64_t rows() const { return s.batch * s.seq; }
};

Problem make_problem(int64_t seq, int64_t chunk) {
  Problem p;
  p.s = {2, seq, 4, 3, 2, 5, chunk, 4 * 3 + 2, 4, 2 * 2 * 5, 4 * 3};
  const int64_t rows = p.rows();
  p.x = random_vector(rows * p.s.x_stride, 1);
  p.dt = random_vector(rows * p.s.heads, 2);
  p.dt_bias = random_vector(p.s.heads, 3, 0.5f);
  p.A_log = random_vector(p.s.heads, 4, 0.5f);
  p.BC = random_vector(rows * p.s.bc_stride, 5, 0.7f);
  p.D = random_vector(p.s.heads, 6);
  p.dy = random_vector(rows * p.s.y_stride, 7);
  return p;
}

double softplus(double v) { return std::log1p(std::exp(v)); }
double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

struct Grads {
  std::vector<double> x, dt, dt_bias, A_log, BC, D;
};

// The recurrence token by token in double, with its reverse-mode gradients.
std::vector<double> reference(Problem& p, Grads& gr) {
  const SsdShape& s = p.s;
  const int64_t P = s.head_dim, N = s.state, G = s.groups;
  std::vector<double> y(p.rows() * s.y_stride, 0.0);
  gr = {std::vector<double>(p.x.size()), std::vector<double>(p.dt.size()), std::vector<double>(s.heads),
        std::vector<double>(s.heads), std::vector<double>(p.BC.size()), std::vector<double>(s.heads)};
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t g = h / (s.heads / G);
      const double A = -std::exp(static_cast<double>(p.A_log[h]));
      std::vector<std::vector<double>> states(s.seq + 1, std::vector<double>(P * N, 0.0));
      auto starts = [&](int64_t t) { return t == 0 || (!p.docs.empty() && p.docs[b * s.seq + t] != p.docs[b * s.seq + t - 1]); };
      auto at = [&](int64_t t) { return b * s.seq + t; };
      for (int64_t t = 0; t < s.seq; ++t) {
        const double dt = softplus(p.dt[at(t) * s.heads + h] + p.dt_bias[h]), a = std::exp(dt * A);
        const std::vector<double> prev = starts(t) ? std::vector<double>(P * N, 0.0) : states[t];
        for (int64_t q = 0; q < P; ++q) {
          double acc = p.D[h] * p.x[at(t) * s.x_stride + h * P + q];
          for (int64_t n = 0; n < N; ++n) {
            const double v = a * prev[q * N + n] + dt * p.x[at(t) * s.x_stride + h * P + q] * p.BC[at(t) * s.bc_stride + g * N + n];
            states[t + 1][q * N + n] = v;
            acc += v * p.BC[at(t) * s.bc_stride + G * N + g * N + n];
          }
          y[at(t) * s.y_stride + h * P + q] = acc;
        }
      }
      std::vector<double> dS(P * N, 0.0);
      for (int64_t t = s.seq - 1; t >= 0; --t) {
        const double raw = p.dt[at(t) * s.heads + h] + p.dt_bias[h], dt = softplus(raw), a = std::exp(dt * A);
        const std::vector<double> prev = starts(t) ? std::vector<double>(P * N, 0.0) : states[t];
        const std::vector<double>& S = states[t + 1];
        double ddt = 0.0, da = 0.0;
        for (int64_t q = 0; q < P; ++q) {
          const int64_t xi = at(t) * s.x_stride + h * P + q;
          const double dyq = p.dy[at(t) * s.y_stride + h * P + q];
          gr.x[xi] += p.D[h] * dyq;
          gr.D[h] += dyq * p.x[xi];
          for (int64_t n = 0; n < N; ++n) {
            const int64_t bi = at(t) * s.bc_stride + g * N + n, ci = bi + G * N;
            dS[q * N + n] += dyq * p.BC[ci];
            gr.BC[ci] += S[q * N + n] * dyq;
          }
          for (int64_t n = 0; n < N; ++n) {
            const int64_t bi = at(t) * s.bc_stride + g * N + n;
            const double d = dS[q * N + n];
            gr.x[xi] += dt * d * p.BC[bi];
            gr.BC[bi] += dt * d * p.x[xi];
            ddt += p.x[xi] * d * p.BC[bi];
            da += d * prev[q * N + n];
          }
        }
        for (double& d : dS) d = starts(t) ? 0.0 : d * a;
        ddt += da * a * A;
        gr.A_log[h] += da * a * A * dt;
        const double draw = ddt * sigmoid(raw);
        gr.dt[at(t) * s.heads + h] += draw;
        gr.dt_bias[h] += draw;
      }
    }
  }
  return y;
}

template <typename A, typename B>
void expect_close(const char* what, const A& got, const B& want, double rel = 1e-5) {
  double scale = 0.0;
  for (auto v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * scale + 1e-12) << what << "[" << i << "]";
}

void expect_scan_matches_recurrence(Problem& p) {
  Grads want;
  const std::vector<double> y_ref = reference(p, want);
  std::vector<float> y(y_ref.size(), 0.0f);
  const int32_t* docs = p.docs.empty() ? nullptr : p.docs.data();
  ssd_scan_forward(y.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(), p.D.data(),
                   p.s, docs);
  expect_close("y", y, y_ref);
  std::vector<float> dx(p.x.size()), ddt(p.dt.size()), dbias(p.s.heads), dA(p.s.heads), dBC(p.BC.size()),
      dD(p.s.heads);
  ssd_scan_backward(dx.data(), ddt.data(), dbias.data(), dA.data(), dBC.data(), dBC.data() + p.s.groups * p.s.state,
                    dD.data(), p.dy.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(),
                    p.D.data(), p.s, docs);
  expect_close("dx", dx, want.x);
  expect_close("ddt", ddt, want.dt);
  expect_close("ddt_bias", dbias, want.dt_bias);
  expect_close("dA_log", dA, want.A_log);
  expect_close("dBC", dBC, want.BC);
  expect_close("dD", dD, want.D);
}

TEST(SsdScan, ChunkedEqualsRecurrenceForAnyChunkSize) {
  for (int64_t chunk : {1, 3, 4, 12, 64}) {  // 12 = T; 64 > T
    SCOPED_TRACE(chunk);
    Problem p = make_problem(12, chunk);
    expect_scan_matches_recurrence(p);
  }
  Problem p = make_problem(12, 5);  // 5 does not divide 12
  expect_scan_matches_recurrence(p);
}

TEST(SsdScan, DocumentsRestartTheState) {
  Problem p = make_problem(13, 4);
  p.docs = {0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, /* row 2 */ 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3};
  ASSERT_EQ(static_cast<int64_t>(p.docs.size()), p.rows());  // a document id per token
  expect_scan_matches_recurrence(p);
  // And the scan with documents differs from the scan without (the test can fail).
  std::vector<float> with(p.rows() * p.s.y_stride), without(with.size());
  ssd_scan_forward(with.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(),
                   p.D.data(), p.s, p.docs.data());
  ssd_scan_forward(without.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(),
                   p.D.data(), p.s, nullptr);
  EXPECT_NE(with, without);
}

TEST(SsdScan, StepByStepEqualsScan) {
  Problem p = make_problem(7, 3);
  std::vector<float> y(p.rows() * p.s.y_stride), stepped(y.size());
  ssd_scan_forward(y.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(), p.D.data(),
                   p.s, nullptr);
  std::vector<float> state(p.s.batch * p.s.heads * p.s.head_dim * p.s.state, 0.0f);
  SsdShape one = p.s;
  one.seq = 1;
  for (int64_t t = 0; t < p.s.seq; ++t) {
    // Row b of this step is token t of sequence b: stride over seq rows.
    one.x_stride = p.s.x_stride * p.s.seq;
    one.dt_stride = p.s.dt_stride * p.s.seq;
    one.bc_stride = p.s.bc_stride * p.s.seq;
    one.y_stride = p.s.y_stride * p.s.seq;
    ssd_scan_step(stepped.data() + t * p.s.y_stride, state.data(), nullptr, p.x.data() + t * p.s.x_stride,
                  p.dt.data() + t * p.s.dt_stride, p.dt_bias.data(), p.A_log.data(), p.B() + t * p.s.bc_stride,
                  p.C() + t * p.s.bc_stride, p.D.data(), one);
  }
  expect_close("y", stepped, y);
}

// A prompt prefilled in chunks through the step entry (s.seq tokens at once, continuing each
// sequence's state): the whole row's scan, and the state token-by-token steps leave (to fp32
// rounding: the steps round it at every token), whatever the cuts (block boundaries inside a
// chunk, chunks of one token).
TEST(SsdScan, ChunksContinuingTheStateEqualTheWholeScan) {
  Problem p = make_problem(11, 4);
  const SsdShape& s = p.s;
  const int64_t state_size = s.heads * s.head_dim * s.state;
  std::vector<float> y(p.rows() * s.y_stride);
  ssd_scan_forward(y.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(), p.D.data(), s,
                   nullptr);
  // Runs of `cuts` tokens of each row through the step entry, from a zero state.
  auto run = [&](const std::vector<int64_t>& cuts, std::vector<float>& out, std::vector<float>& state) {
    out.assign(y.size(), NAN);
    state.assign(s.batch * state_size, 0.0f);
    for (int64_t b = 0; b < s.batch; ++b) {
      int64_t t0 = 0;
      for (int64_t len : cuts) {
        SsdShape chunk = s;
        chunk.batch = 1;
        chunk.seq = len;
        const int64_t row = b * s.seq + t0;
        ssd_scan_step(out.data() + row * s.y_stride, state.data() + b * state_size, nullptr,
                      p.x.data() + row * s.x_stride,
                      p.dt.data() + row * s.dt_stride, p.dt_bias.data(), p.A_log.data(), p.B() + row * s.bc_stride,
                      p.C() + row * s.bc_stride, p.D.data(), chunk);
        t0 += len;
      }
    }
  };
  std::vector<float> stepped, stepped_state;
  run(std::vector<int64_t>(11, 1), stepped, stepped_state);
  for (const std::vector<int64_t>& cuts : std::vector<std::vector<int64_t>>{{11}, {1, 10}, {4, 4, 3}, {3, 6, 1, 1}}) {
    std::vector<float> chunked, state;
    run(cuts, chunked, state);
    SCOPED_TRACE(cuts.size());
    expect_close("y", chunked, y);
    expect_close("state", state, stepped_state);
  }
}

// Decoding sequences whose states are a pool's slots, one call: each row steps exactly its own
// slot as a call of its own would, and a slot no row names is left alone.
TEST(SsdScan, OneStepOverPoolSlotsEqualsEachRowsOwnStep) {
  Problem p = make_problem(3, 4);  // 2 x 3 rows, read as 6 sequences' next tokens
  SsdShape s = p.s;
  s.batch = 3;
  s.seq = 1;
  const int64_t state_size = s.heads * s.head_dim * s.state;
  const std::vector<int32_t> slots = {2, 0, 3};
  const std::vector<float> pool0 = random_vector(5 * state_size, 8);
  std::vector<float> pool = pool0, y(3 * s.y_stride, NAN);
  ssd_scan_step(y.data(), pool.data(), slots.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(),
                p.C(), p.D.data(), s);
  std::vector<float> want_pool = pool0, want_y(y.size(), NAN);
  SsdShape one = s;
  one.batch = 1;
  for (int64_t b = 0; b < 3; ++b) {
    ssd_scan_step(want_y.data() + b * s.y_stride, want_pool.data() + slots[b] * state_size, nullptr,
                  p.x.data() + b * s.x_stride, p.dt.data() + b * s.dt_stride, p.dt_bias.data(), p.A_log.data(),
                  p.B() + b * s.bc_stride, p.C() + b * s.bc_stride, p.D.data(), one);
  }
  EXPECT_EQ(y, want_y);
  EXPECT_EQ(pool, want_pool);  // slots 1 and 4 untouched
}

TEST(SsdScan, BackwardMatchesFiniteDifferences) {
  Problem p = make_problem(9, 4);
  p.docs = {0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 2, 2};
  std::vector<float> y(p.rows() * p.s.y_stride);
  auto loss = [&] {
    ssd_scan_forward(y.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(), p.D.data(),
                     p.s, p.docs.data());
    return weighted_sum(y.data(), p.dy.data(), static_cast<int64_t>(y.size()));
  };
  std::vector<float> dx(p.x.size()), ddt(p.dt.size()), dbias(p.s.heads), dA(p.s.heads), dBC(p.BC.size()),
      dD(p.s.heads);
  ssd_scan_backward(dx.data(), ddt.data(), dbias.data(), dA.data(), dBC.data(), dBC.data() + p.s.groups * p.s.state,
                    dD.data(), p.dy.data(), p.x.data(), p.dt.data(), p.dt_bias.data(), p.A_log.data(), p.B(), p.C(),
                    p.D.data(), p.s, p.docs.data());
  expect_gradient_matches("dx", p.x.data(), p.x.size(), dx.data(), loss);
  expect_gradient_matches("ddt", p.dt.data(), p.dt.size(), ddt.data(), loss);
  expect_gradient_matches("ddt_bias", p.dt_bias.data(), p.s.heads, dbias.data(), loss);
  expect_gradient_matches("dA_log", p.A_log.data(), p.s.heads, dA.data(), loss);
  expect_gradient_matches("dBC", p.BC.data(), p.BC.size(), dBC.data(), loss);
  expect_gradient_matches("dD", p.D.data(), p.s.heads, dD.data(), loss);
}

TEST(MambaKernels, CausalConvBackwardMatchesFiniteDifferences) {
  const ConvShape s{2, 7, 5, 4, 6, 5};
  const std::vector<int32_t> docs = {0, 0, 1, 1, 1, 1, 1, 4, 4, 4, 4, 5, 5, 5};
  auto in = random_vector(2 * 7 * 6, 1), w = random_vector(5 * 4, 2, 0.5f), b = random_vector(5, 3);
  auto dy = random_vector(2 * 7 * 5, 4);
  std::vector<float> out(dy.size());
  auto loss = [&] {
    causal_conv_silu_forward(out.data(), in.data(), w.data(), b.data(), s, docs.data());
    return weighted_sum(out.data(), dy.data(), static_cast<int64_t>(out.size()));
  };
  std::vector<float> din(in.size()), dw(w.size()), db(b.size());
  causal_conv_silu_backward(din.data(), dw.data(), db.data(), dy.data(), in.data(), w.data(), b.data(), s,
                            docs.data());
  expect_gradient_matches("din", in.data(), in.size(), din.data(), loss);
  expect_gradient_matches("dweight", w.data(), w.size(), dw.data(), loss);
  expect_gradient_matches("dbias", b.data(), b.size(), db.data(), loss);
  // A document's first token does not see the previous document.
  std::vector<float> plain(out.size());
  causal_conv_silu_forward(plain.data(), in.data(), w.data(), b.data(), s, nullptr);
  causal_conv_silu_forward(out.data(), in.data(), w.data(), b.data(), s, docs.data());
  EXPECT_EQ(out[0], plain[0]);
  EXPECT_NE(out[2 * 5], plain[2 * 5]);
}

TEST(MambaKernels, CausalConvStepEqualsForward) {
  const ConvShape s{1, 6, 3, 4, 3, 3};
  auto in = random_vector(6 * 3, 1), w = random_vector(3 * 4, 2), b = random_vector(3, 3);
  std::vector<float> full(6 * 3), stepped(6 * 3), window(3 * 3, 0.0f);
  causal_conv_silu_forward(full.data(), in.data(), w.data(), b.data(), s, nullptr);
  ConvShape one = s;
  one.seq = 1;
  for (int64_t t = 0; t < 6; ++t)
    causal_conv_silu_step(stepped.data() + t * 3, window.data(), nullptr, in.data() + t * 3, w.data(), b.data(), one);
  expect_close("conv", stepped, full);
}

// A prompt prefilled in chunks through the step entry (s.seq tokens at once after the window's):
// the outputs of the whole row's convolution, and the window token-by-token steps leave, whatever
// the cuts (chunks shorter than the window too).
TEST(MambaKernels, CausalConvChunksContinuingTheWindowEqualTheForward) {
  const ConvShape s{1, 9, 3, 4, 3, 3};
  auto in = random_vector(9 * 3, 1), w = random_vector(3 * 4, 2), b = random_vector(3, 3);
  std::vector<float> full(9 * 3), ignored(3), stepped_window(3 * 3, 0.0f);
  causal_conv_silu_forward(full.data(), in.data(), w.data(), b.data(), s, nullptr);
  ConvShape one = s;
  one.seq = 1;
  for (int64_t t = 0; t < 9; ++t)
    causal_conv_silu_step(ignored.data(), stepped_window.data(), nullptr, in.data() + t * 3, w.data(), b.data(), one);
  const std::vector<std::vector<int64_t>> all_cuts = {{9}, {1, 8}, {2, 2, 5}, {5, 1, 3}, {2, 7}};
  for (const std::vector<int64_t>& cuts : all_cuts) {
    std::vector<float> out(9 * 3, NAN), window(3 * 3, 0.0f);
    int64_t t0 = 0;
    for (int64_t len : cuts) {
      ConvShape chunk = s;
      chunk.seq = len;
      causal_conv_silu_step(out.data() + t0 * 3, window.data(), nullptr, in.data() + t0 * 3, w.data(), b.data(), chunk);
      t0 += len;
    }
    expect_close("conv", out, full);
    EXPECT_EQ(window, stepped_window) << "cuts of " << cuts.size();
  }
}

// The convolution's decoding step over a pool's window slots, one call: each row's own step.
TEST(MambaKernels, CausalConvStepOverPoolSlotsEqualsEachRowsOwnStep) {
  const ConvShape s{3, 1, 5, 4, 6, 5};
  const int64_t past = 3, window_size = 5 * past;
  auto in = random_vector(3 * 6, 1), w = random_vector(5 * 4, 2), b = random_vector(5, 3);
  const std::vector<int32_t> slots = {1, 3, 0};
  const std::vector<float> pool0 = random_vector(4 * window_size, 4);
  std::vector<float> pool = pool0, out(3 * 5, NAN), want_pool = pool0, want_out(out.size(), NAN);
  causal_conv_silu_step(out.data(), pool.data(), slots.data(), in.data(), w.data(), b.data(), s);
  ConvShape one = s;
  one.batch = 1;
  for (int64_t r = 0; r < 3; ++r) {
    causal_conv_silu_step(want_out.data() + r * 5, want_pool.data() + slots[r] * window_size, nullptr,
                          in.data() + r * 6, w.data(), b.data(), one);
  }
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(pool, want_pool);  // slot 2 untouched
}

TEST(MambaKernels, GatedRmsNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3, dim = 8, group = 4, z_stride = 11;
  auto y = random_vector(rows * dim, 1), z = random_vector(rows * z_stride, 2), w = random_vector(dim, 3);
  auto dy = random_vector(rows * dim, 4);
  std::vector<float> out(rows * dim), rstd(rows * 2);
  auto loss = [&] {
    gated_rmsnorm_forward(out.data(), rstd.data(), y.data(), z.data(), z_stride, w.data(), rows, dim, group, 1e-5f);
    return weighted_sum(out.data(), dy.data(), rows * dim);
  };
  loss();
  std::vector<float> dyv(y.size()), dz(z.size()), dw(w.size());
  gated_rmsnorm_backward(dyv.data(), dz.data(), dw.data(), dy.data(), y.data(), z.data(), z_stride, w.data(),
                         rstd.data(), rows, dim, group);
  // Small groups are strongly curved: a smaller step than the default.
  const loom::testing::FdTolerance tol{1e-3, 1e-4, 1e-2, 48};
  expect_gradient_matches("dy", y.data(), y.size(), dyv.data(), loss, tol);
  expect_gradient_matches("dz", z.data(), z.size(), dz.data(), loss, tol);
  expect_gradient_matches("dweight", w.data(), w.size(), dw.data(), loss, tol);
}

TEST(MambaKernels, Relu2BackwardMatchesFiniteDifferences) {
  auto x = random_vector(40, 1), dy = random_vector(40, 2);
  std::vector<float> out(40), dx(40, 1e3f);  // dx poisoned: the backward writes every element
  auto loss = [&] {
    relu2_forward(out.data(), x.data(), 40);
    return weighted_sum(out.data(), dy.data(), 40);
  };
  relu2_backward(dx.data(), dy.data(), x.data(), 40);
  expect_gradient_matches("dx", x.data(), 40, dx.data(), loss);
}

}  // namespace
}  // namespace loom::kernels::cpu
