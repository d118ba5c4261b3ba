// The chunk-parallel form of Mamba-2's scan (kernels/ssd_chunks_scan.h), the one the CUDA backend
// runs with cuBLAS's batched GEMMs, run here by a host executor (loops, and OpenBLAS's column-major
// GEMMs called as the CUDA executor calls cuBLAS's) and held to the CPU's scan
// (kernels/cpu/ssd_scan.h): forward, backward adding into non-zero gradients, and prompt chunks
// continuing a carried state; awkward shapes (a sequence not a multiple of the chunk, a chunk
// longer than the sequence, fewer groups than heads, head_dim 1, strided rows), packed documents
// (starts inside chunks, on a chunk's first token, single-token documents), the heads in one slice,
// one head a slice, and slices of two heads or of whole groups. The work memory is poisoned (NaN)
// so a read of an element no step wrote shows.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "loom/kernels/cpu/ssd_scan.h"
#include "loom/kernels/ssd_chunks_scan.h"

namespace loom::kernels::ssd_chunks {
namespace {

class HostExecutor {
 public:
  template <class T>
  T* take(int64_t n) {
    const size_t bytes = static_cast<size_t>(n) * sizeof(T) + 1;
    held_.push_back(std::make_unique<unsigned char[]>(bytes));
    std::memset(held_.back().get(), 0xff, bytes);  // NaN doubles, -1 ints
    return reinterpret_cast<T*>(held_.back().get());
  }
  template <class F>
  void each(int64_t n, const F& step) {
    for (int64_t i = 0; i < n; ++i) step(i);
  }
  // Each product as the CUDA executor calls cuBLAS (column_major: B first, widths swapped), here
  // through OpenBLAS's column-major dgemm / sgemm.
  template <typename Real>
  void product(const Product<Real>& p) {
    ++products;
    const ColumnMajorCall call = column_major(p);
    const auto op = [](bool trans) { return trans ? CblasTrans : CblasNoTrans; };
    const int m = static_cast<int>(call.m), n = static_cast<int>(call.n), k = static_cast<int>(call.k);
    const int ld_first = static_cast<int>(call.ld_first), ld_second = static_cast<int>(call.ld_second);
    for (int64_t i = 0; i < p.count; ++i) {
      Real* first = operand_at(p, p.b, i);
      Real* second = operand_at(p, p.a, i);
      Real* c = operand_at(p, p.c, i);
      if constexpr (std::is_same_v<Real, double>) {
        cblas_dgemm(CblasColMajor, op(call.trans_first), op(call.trans_second), m, n, k, 1.0, first, ld_first, second,
                    ld_second, p.beta, c, static_cast<int>(call.ldc));
      } else {
        cblas_sgemm(CblasColMajor, op(call.trans_first), op(call.trans_second), m, n, k, 1.0f, first, ld_first, second,
                    ld_second, static_cast<float>(p.beta), c, static_cast<int>(call.ldc));
      }
    }
  }
  int products = 0;

 private:
  std::vector<std::unique_ptr<unsigned char[]>> held_;
};

std::vector<float> random_floats(std::mt19937& rng, int64_t n, float scale) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// Largest |a - b| / (|b| + 1e-3 max|b|) over the elements (NaN in both: equal).
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0.0, worst = 0.0;
  for (float v : b)
    if (!std::isnan(v)) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / (std::fabs(b[i]) + 1e-3 * scale));
  }
  return worst;
}

struct Problem {
  SsdShape s;
  std::vector<float> x, dt_raw, dt_bias, A_log, B, C, D, dy;
  std::vector<int32_t> docs;
  Inputs inputs(bool packed) const {
    return {x.data(), dt_raw.data(), dt_bias.data(), A_log.data(), B.data(), C.data(), D.data(),
            packed ? docs.data() : nullptr, nullptr, nullptr};
  }
};

// Rows padded past their widths; documents start with probability 1/5 per token, at every
// chunk's first token of the second row, and at the last two tokens of each row.
Problem make_problem(uint32_t seed, int64_t batch, int64_t seq, int64_t heads, int64_t P, int64_t groups, int64_t N,
                     int64_t chunk) {
  std::mt19937 rng(seed);
  Problem p;
  p.s = {batch, seq, heads, P, groups, N, chunk, heads * P + 3, heads + 2, groups * N + 5, heads * P + 1};
  const int64_t rows = batch * seq;
  p.x = random_floats(rng, rows * p.s.x_stride, 1.0f);
  p.dt_raw = random_floats(rng, rows * p.s.dt_stride, 1.0f);
  p.dt_bias = random_floats(rng, heads, 0.5f);
  p.A_log = random_floats(rng, heads, 0.5f);
  p.B = random_floats(rng, rows * p.s.bc_stride, 1.0f);
  p.C = random_floats(rng, rows * p.s.bc_stride, 1.0f);
  p.D = random_floats(rng, heads, 1.0f);
  p.dy = random_floats(rng, rows * p.s.y_stride, 1.0f);
  std::uniform_int_distribution<int> die(0, 4);
  for (int64_t b = 0; b < batch; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < seq; ++t) {
      if (t > 0 && (die(rng) == 0 || (b == 1 && t % chunk == 0) || t >= seq - 2)) ++id;
      p.docs.push_back(id);
    }
  }
  return p;
}

std::vector<Problem> problems() {
  return {make_problem(1, 1, 1, 1, 1, 1, 4, 4),      make_problem(2, 2, 13, 4, 3, 2, 4, 5),
          make_problem(3, 3, 37, 6, 2, 3, 8, 8),     make_problem(4, 1, 70, 2, 1, 1, 16, 16),
          make_problem(5, 2, 45, 4, 16, 1, 16, 64),  make_problem(6, 2, 50, 4, 8, 2, 16, 16),
          make_problem(7, 2, 24, 8, 4, 4, 8, 8),     make_problem(8, 1, 20, 12, 2, 2, 4, 8)};
}

std::string describe(const SsdShape& s, bool packed, int64_t slice_bytes) {
  return "batch " + std::to_string(s.batch) + " seq " + std::to_string(s.seq) + " heads " + std::to_string(s.heads) +
         " head_dim " + std::to_string(s.head_dim) + " groups " + std::to_string(s.groups) + " state " +
         std::to_string(s.state) + " chunk " + std::to_string(s.chunk) + (packed ? " packed" : "") +
         " slice bytes " + std::to_string(slice_bytes);
}

constexpr int64_t kOneSlice = int64_t{1} << 40, kGroupASlice = 1;

// Work memory for two heads and a group's B and C: slices of one group where a group has two
// heads or one, of two heads of a larger group, of two groups of one head.
template <typename Real>
int64_t two_heads(const SsdShape& s, bool backward) {
  const int64_t Q = std::min(s.chunk, s.seq), row_chunks = s.batch * ((s.seq + Q - 1) / Q);
  return static_cast<int64_t>(sizeof(Real)) * row_chunks *
         (2 * head_elements(s, Q, backward) + group_elements(s, Q, backward));
}

// The form in double (the CPU's arithmetic: fp32 results within about an ulp of it) and in float
// (the work arrays and products in fp32, as the GPU runs them on TF32 tensor cores, whose 10-bit
// mantissa the GPU's tests allow for; here the products are exact fp32: within 1.9e-4 here).
template <typename Real>
class SsdChunks : public ::testing::Test {
 protected:
  static constexpr double kTolerance = std::is_same_v<Real, double> ? 1e-6 : 1e-3;
};
using Reals = ::testing::Types<double, float>;
TYPED_TEST_SUITE(SsdChunks, Reals);

TYPED_TEST(SsdChunks, ForwardAndBackwardEqualTheCpuScan) {
  using Real = TypeParam;
  const double kTolerance = TestFixture::kTolerance;
  for (const Problem& p : problems()) {
    for (bool packed : {false, true}) {
      for (int64_t slice_bytes : {kOneSlice, kGroupASlice, two_heads<Real>(p.s, true)}) {
        SCOPED_TRACE(describe(p.s, packed, slice_bytes));
        const SsdShape& s = p.s;
        const int64_t rows = s.batch * s.seq;
        const Inputs in = p.inputs(packed);
        std::vector<float> want_y(rows * s.y_stride, NAN), got_y = want_y;
        cpu::ssd_scan_forward(want_y.data(), in.x, in.dt_raw, in.dt_bias, in.A_log, in.B, in.C, in.D, s, in.documents);
        HostExecutor ex;
        forward<Real>(ex, got_y.data(), in, s, slice_bytes);
        EXPECT_LE(relative_error(got_y, want_y), kTolerance) << "y";

        std::mt19937 rng(11);
        const std::vector<float> dx0 = random_floats(rng, rows * s.x_stride, 0.5f),
                                 ddt0 = random_floats(rng, rows * s.dt_stride, 0.5f),
                                 dB0 = random_floats(rng, rows * s.bc_stride, 0.5f),
                                 dC0 = random_floats(rng, rows * s.bc_stride, 0.5f),
                                 dh0 = random_floats(rng, 3 * s.heads, 0.5f);
        std::vector<float> dx = dx0, ddt = ddt0, dB = dB0, dC = dC0, dh = dh0;
        cpu::ssd_scan_backward(dx.data(), ddt.data(), dh.data(), dh.data() + s.heads, dB.data(), dC.data(),
                               dh.data() + 2 * s.heads, p.dy.data(), in.x, in.dt_raw, in.dt_bias, in.A_log, in.B,
                               in.C, in.D, s, in.documents);
        std::vector<float> got_dx = dx0, got_ddt = ddt0, got_dB = dB0, got_dC = dC0, got_dh = dh0;
        const Grads out{got_dx.data(), got_ddt.data(), got_dh.data(), got_dh.data() + s.heads, got_dB.data(),
                        got_dC.data(), got_dh.data() + 2 * s.heads, p.dy.data()};
        HostExecutor back;
        backward<Real>(back, out, in, s, slice_bytes);
        EXPECT_LE(relative_error(got_dx, dx), kTolerance) << "dx";
        EXPECT_LE(relative_error(got_ddt, ddt), kTolerance) << "d(dt_raw)";
        EXPECT_LE(relative_error(got_dB, dB), kTolerance) << "dB";
        EXPECT_LE(relative_error(got_dC, dC), kTolerance) << "dC";
        EXPECT_LE(relative_error(got_dh, dh), kTolerance) << "d(dt_bias), d(A_log), d(D)";
      }
    }
  }
}

// A prompt's chunk continuing each row's state (ssd_scan_step with several tokens): y and the
// state after the row's last token, in place.
TYPED_TEST(SsdChunks, ChunksContinuingAStateEqualTheCpuSteps) {
  using Real = TypeParam;
  const double kTolerance = TestFixture::kTolerance;
  for (const Problem& p : problems()) {
    for (int64_t slice_bytes : {kOneSlice, kGroupASlice, two_heads<Real>(p.s, false)}) {
      SCOPED_TRACE(describe(p.s, false, slice_bytes));
      const SsdShape& s = p.s;
      const int64_t rows = s.batch * s.seq;
      std::mt19937 rng(5);
      const std::vector<float> state0 = random_floats(rng, s.batch * s.heads * s.head_dim * s.state, 1.0f);
      std::vector<float> want_state = state0, want_y(rows * s.y_stride, NAN);
      Inputs in = p.inputs(false);
      cpu::ssd_scan_step(want_y.data(), want_state.data(), nullptr, in.x, in.dt_raw, in.dt_bias, in.A_log, in.B,
                         in.C, in.D, s);
      if (s.seq == 1) continue;  // one token is the recurrence's step, not the chunked scan
      std::vector<float> got_state = state0, got_y(rows * s.y_stride, NAN);
      in.initial = got_state.data();
      in.final = got_state.data();
      HostExecutor ex;
      forward<Real>(ex, got_y.data(), in, s, slice_bytes);
      EXPECT_LE(relative_error(got_y, want_y), kTolerance) << "y";
      EXPECT_LE(relative_error(got_state, want_state), kTolerance) << "state";
    }
  }
}

// The slices' sizes: whole groups as the bytes hold them, else the most heads of a group that
// divide it; each slice runs the same products again.
TEST(SsdChunkSlices, SlicesTakeWholeGroupsOrPartsOfOne) {
  const Problem p = make_problem(9, 2, 24, 8, 4, 4, 8, 8);  // 8 heads in 4 groups of 2
  const Dims one = slice_dims<double>(p.s, true, kOneSlice), each = slice_dims<double>(p.s, true, kGroupASlice);
  EXPECT_EQ(one.heads, 8);
  EXPECT_EQ(one.groups_here(), 4);
  EXPECT_EQ(each.heads, 1);  // one head of a group
  EXPECT_EQ(each.groups_here(), 1);
  EXPECT_EQ(one.Q, 8);
  EXPECT_EQ(one.chunks, 3);
  // Bytes of a head's and a group's arrays: 8-byte doubles over 2 rows of 3 chunks.
  const int64_t head_bytes = 8 * 2 * 3 * head_elements(p.s, 8, true);
  const int64_t group_bytes = 8 * 2 * 3 * group_elements(p.s, 8, true);
  const Dims two_groups = slice_dims<double>(p.s, true, 2 * (2 * head_bytes + group_bytes) + 7);
  EXPECT_EQ(two_groups.heads, 4);
  EXPECT_EQ(slice_at(two_groups, 4).first_group(), 2);
  const Problem wide = make_problem(10, 1, 20, 12, 2, 2, 4, 8);  // 12 heads in 2 groups of 6
  const int64_t wide_head = 8 * 3 * head_elements(wide.s, 8, true);  // one row of 3 chunks
  const int64_t wide_group = 8 * 3 * group_elements(wide.s, 8, true);
  EXPECT_EQ(slice_dims<double>(wide.s, true, 5 * wide_head + wide_group).heads, 3);  // 3 divides 6, 5 and 4 do not
  EXPECT_EQ(slice_dims<double>(wide.s, true, 6 * wide_head + wide_group).heads, 6);
  EXPECT_EQ(slice_dims<double>(wide.s, true, 11 * wide_head + 2 * wide_group).heads, 6);  // not two groups yet
  HostExecutor all, sliced;
  std::vector<float> y(p.s.batch * p.s.seq * p.s.y_stride);
  forward<double>(all, y.data(), p.inputs(true), p.s, kOneSlice);
  forward<double>(sliced, y.data(), p.inputs(true), p.s, kGroupASlice);
  EXPECT_EQ(sliced.products, 8 * all.products);
}

}  // namespace
}  // namespace loom::kernels::ssd_chunks
