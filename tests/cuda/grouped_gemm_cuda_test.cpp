// Several independent precision GEMMs in one call (kernels::precision_linear_gemms, an MoE layer's
// experts: kernels/cuda/grouped_gemm.h) on the GPU, grouped into cuBLAS's grouped product and one
// by one, against fp64 references of each GEMM: forward, dgrad and wgrad of experts with awkward
// row counts (1 to 200); bf16 outputs written whole, fp32 outputs rounded to bf16 (widened from a
// bf16 scratch, one pass per run of adjacent outputs: the experts' rows given in reverse and with
// a gap too), weight gradients written or added into unrounded; a GEMM that is not groupable (a
// bias) and one of zero rows among them, run alone; all three output kinds in one call; widths
// not a multiple of 8 one by one (cuBLAS's grouped kernels load 16 bytes). bf16 outputs within
// 1e-2 of fp64, fp32 sums of bf16 products within 1e-5; outputs poisoned first; fresh random
// inputs. bf16 and rounded outputs must have run grouped (a refusal fails, with cuBLAS's reason on
// stderr); weight gradients grouped or, where cuBLAS refuses fp32 outputs, one by one, saying so.
// Skipped, saying why, without a GPU.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/grouped_gemm.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceArray;
using testing::DeviceFloats;
using testing::random_values;
using testing::relative_error;
using testing::to_bf16;
using testing::to_float;

const Device kGpu = Device::cuda(0);
const std::vector<int64_t> kRows = {37, 1, 128, 64, 200, 3};
constexpr int64_t kIn = 72, kOut = 40;

// Grouping forced on (every call of several GEMMs) or off, for one test's span.
struct Grouping {
  explicit Grouping(bool on) { set_grouped_gemm_most_rows(on ? int64_t{1} << 20 : 0); }
  ~Grouping() { set_grouped_gemm_most_rows(-1); }
};

// The experts' operands, one bf16 tensor each for the inputs and output gradients (their rows one
// expert after another) and a bf16 weight per expert, with fp64-exact float copies.
struct Experts {
  Experts(CachingAllocator& allocator, uint32_t seed, int64_t in_features = kIn, int64_t out_features = kOut)
      : ic(in_features),
        oc(out_features),
        total(sum(kRows)),
        in(bf16_rounded(random_values(seed, total * ic, 1.0f))),
        dout(bf16_rounded(random_values(seed + 1, total * oc, 1.0f))),
        in16(allocator, to_bf16(in)),
        dout16(allocator, to_bf16(dout)) {
    for (size_t e = 0; e < kRows.size(); ++e) {
      weights.push_back(bf16_rounded(random_values(seed + 10 + static_cast<uint32_t>(e), oc * ic, 0.2f)));
      weights16.push_back(std::make_unique<DeviceArray<__nv_bfloat16>>(allocator, to_bf16(weights.back())));
    }
  }
  static int64_t sum(const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  }
  int64_t ic, oc, total;  // in and out features, rows in all
  std::vector<float> in, dout;
  DeviceArray<__nv_bfloat16> in16, dout16;
  std::vector<std::vector<float>> weights;
  std::vector<std::unique_ptr<DeviceArray<__nv_bfloat16>>> weights16;  // device arrays neither copy nor move
};

// Expert e's GEMM of `pass` with its operands set (a16, and b16 or b's ready store); the output
// is the caller's.
PrecisionGemm expert_gemm(const Experts& x, LinearGemm pass, size_t e, int64_t at) {
  PrecisionGemm g;
  g.pass = pass;
  g.a.cast = g.b.cast = OperandCast::Bf16;
  g.n = kRows[e];
  g.in_features = x.ic;
  g.out_features = x.oc;
  if (pass == LinearGemm::Forward) {
    g.a16 = x.in16.ptr + at * x.ic;
  } else {
    g.a16 = x.dout16.ptr + at * x.oc;
  }
  if (pass == LinearGemm::WeightGrad) {
    g.b16 = x.in16.ptr + at * x.ic;
  } else {
    g.b_store = x.weights16[e]->ptr;
    g.b_store_use = CastStore::Read;
  }
  return g;
}

// Expert e's product in fp64: forward in . W^T, dgrad dout . W (both [rows, width] at its rows),
// wgrad dout^T . in [OC, IC].
std::vector<double> reference(const Experts& x, LinearGemm pass, size_t e, int64_t at) {
  const int64_t rows = kRows[e];
  const std::vector<float>& w = x.weights[e];
  std::vector<double> out;
  if (pass == LinearGemm::WeightGrad) {
    out.assign(x.oc * x.ic, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < x.oc; ++o)
        for (int64_t i = 0; i < x.ic; ++i)
          out[o * x.ic + i] += double(x.dout[(at + r) * x.oc + o]) * double(x.in[(at + r) * x.ic + i]);
    return out;
  }
  const bool forward = pass == LinearGemm::Forward;
  const int64_t width = forward ? x.oc : x.ic;
  out.assign(rows * width, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < width; ++c) {
      double s = 0.0;
      if (forward) {
        for (int64_t i = 0; i < x.ic; ++i) s += double(x.in[(at + r) * x.ic + i]) * double(w[c * x.ic + i]);
      } else {
        for (int64_t o = 0; o < x.oc; ++o) s += double(x.dout[(at + r) * x.oc + o]) * double(w[o * x.ic + c]);
      }
      out[r * width + c] = s;
    }
  return out;
}

class CudaGroupedGemm : public testing::GpuTest<> {
 protected:
  // Forward or dgrad of every expert into one output tensor (bf16, or fp32 rounded to bf16), run
  // with grouping on or off: each expert's rows against its reference.
  // With `gap`, expert 3's output lies a row further on (two runs of adjacent outputs), and the
  // GEMMs are given last expert first.
  void check_rows(LinearGemm pass, bool bf16_out, bool grouped, bool gap = false) {
    const Experts x(allocator_, seed_);
    const int64_t width = pass == LinearGemm::Forward ? kOut : kIn;
    const int64_t rows_out = x.total + (gap ? 1 : 0);
    DeviceArray<__nv_bfloat16> out16(allocator_, std::vector<__nv_bfloat16>(rows_out * width, __float2bfloat16(NAN)));
    DeviceFloats out(allocator_, std::vector<float>(rows_out * width, NAN));
    std::vector<PrecisionGemm> gemms;
    std::vector<int64_t> out_row(kRows.size());
    int64_t at = 0;
    for (size_t e = 0; e < kRows.size(); ++e) {
      out_row[e] = at + (gap && e >= 3 ? 1 : 0);
      PrecisionGemm g = expert_gemm(x, pass, e, at);
      if (bf16_out) {
        g.out16 = out16.ptr + out_row[e] * width;
      } else {
        g.out = out.ptr + out_row[e] * width;
      }
      g.rounding = OutputRounding::Bf16;  // a 16-bit forward's or dgrad's, either way
      ASSERT_TRUE(groupable(g));
      gemms.insert(gap ? gemms.begin() : gemms.end(), g);
      at += kRows[e];
    }
    const GroupedGemmCounts before = grouped_gemm_counts();
    {
      const Grouping grouping(grouped);
      precision_linear_gemms(kGpu, gemms.data(), static_cast<int64_t>(gemms.size()));
    }
    const GroupedGemmCounts after = grouped_gemm_counts();
    EXPECT_EQ(after.refused, before.refused) << "cuBLAS refused the grouped product (its reason on stderr)";
    EXPECT_EQ(after.grouped - before.grouped, grouped ? 1 : 0);
    const std::vector<float> got = bf16_out ? to_float(out16.host()) : out.host();
    at = 0;
    for (size_t e = 0; e < kRows.size(); ++e) {
      const std::vector<float> rows(got.begin() + out_row[e] * width, got.begin() + (out_row[e] + kRows[e]) * width);
      EXPECT_LE(relative_error(rows, reference(x, pass, e, at)), 1e-2) << "expert " << e;
      EXPECT_EQ(rows, bf16_rounded(rows)) << "expert " << e << ": not rounded to bf16";
      at += kRows[e];
    }
    if (gap) {
      for (int64_t c = 0; c < width; ++c) {
        EXPECT_TRUE(std::isnan(got[out_row[3] * width - width + c])) << "the gap";
      }
    }
  }

  // wgrad of every expert into its own fp32 gradient, written or added into random values.
  void check_weight_gradients(bool accumulate, bool grouped) {
    const Experts x(allocator_, seed_);
    std::vector<std::vector<float>> start;
    std::vector<std::unique_ptr<DeviceFloats>> grads;
    std::vector<PrecisionGemm> gemms;
    int64_t at = 0;
    for (size_t e = 0; e < kRows.size(); ++e) {
      start.push_back(accumulate ? random_values(seed_ + 50 + static_cast<uint32_t>(e), kOut * kIn, 1.0f)
                                 : std::vector<float>(kOut * kIn, NAN));
      grads.push_back(std::make_unique<DeviceFloats>(allocator_, start.back()));
      PrecisionGemm g = expert_gemm(x, LinearGemm::WeightGrad, e, at);
      g.out = grads.back()->ptr;
      g.accumulate = accumulate;
      g.rounding = OutputRounding::None;
      ASSERT_TRUE(groupable(g));
      gemms.push_back(g);
      at += kRows[e];
    }
    const GroupedGemmCounts before = grouped_gemm_counts();
    {
      const Grouping grouping(grouped);
      precision_linear_gemms(kGpu, gemms.data(), static_cast<int64_t>(gemms.size()));
    }
    const GroupedGemmCounts after = grouped_gemm_counts();
    EXPECT_EQ(after.grouped - before.grouped + after.refused - before.refused, grouped ? 1 : 0);
    if (after.refused > before.refused) std::printf("cuBLAS refuses grouped weight gradients: they ran one by one\n");
    at = 0;
    for (size_t e = 0; e < kRows.size(); ++e) {
      std::vector<double> want = reference(x, LinearGemm::WeightGrad, e, at);
      if (accumulate)
        for (size_t i = 0; i < want.size(); ++i) want[i] += start[e][i];
      EXPECT_LE(relative_error(grads[e]->host(), want), 1e-5) << "expert " << e;
      at += kRows[e];
    }
  }
};

TEST_F(CudaGroupedGemm, ForwardsIntoBf16AndRoundedFp32EqualEachExpertsProduct) {
  for (const bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one by one");
    check_rows(LinearGemm::Forward, true, grouped);
    check_rows(LinearGemm::Forward, false, grouped);
  }
}

TEST_F(CudaGroupedGemm, RoundedOutputsGivenInReverseAroundAGapEachGetTheirOwnRows) {
  check_rows(LinearGemm::Forward, false, true, true);
  check_rows(LinearGemm::DataGrad, false, true, true);
}

TEST_F(CudaGroupedGemm, DataGradientsIntoBf16AndRoundedFp32EqualEachExpertsProduct) {
  for (const bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one by one");
    check_rows(LinearGemm::DataGrad, true, grouped);
    check_rows(LinearGemm::DataGrad, false, grouped);
  }
}

TEST_F(CudaGroupedGemm, WeightGradientsWrittenOrAddedEqualEachExpertsProduct) {
  for (const bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one by one");
    check_weight_gradients(true, grouped);
    check_weight_gradients(false, grouped);
  }
}

// A GEMM that is not groupable (a bias, added by cuBLASLt's epilogue) among groupable ones runs
// alone with its bias; the others still run as one grouped product.
TEST_F(CudaGroupedGemm, AGemmWithABiasAmongThemRunsAloneWithIt) {
  const Experts x(allocator_, seed_);
  const std::vector<float> bias = random_values(seed_ + 99, kOut, 1.0f);
  DeviceFloats bias_on_device(allocator_, bias);
  DeviceArray<__nv_bfloat16> out16(allocator_, std::vector<__nv_bfloat16>(x.total * kOut, __float2bfloat16(NAN)));
  std::vector<PrecisionGemm> gemms;
  int64_t at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    PrecisionGemm g = expert_gemm(x, LinearGemm::Forward, e, at);
    g.out16 = out16.ptr + at * kOut;
    if (e == 2) g.bias = bias_on_device.ptr;
    EXPECT_EQ(groupable(g), e != 2);
    gemms.push_back(g);
    at += kRows[e];
  }
  const GroupedGemmCounts before = grouped_gemm_counts();
  {
    const Grouping grouping(true);
    precision_linear_gemms(kGpu, gemms.data(), static_cast<int64_t>(gemms.size()));
  }
  EXPECT_EQ(grouped_gemm_counts().grouped - before.grouped, 1);
  const std::vector<float> got = to_float(out16.host());
  at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    std::vector<double> want = reference(x, LinearGemm::Forward, e, at);
    if (e == 2)
      for (int64_t r = 0; r < kRows[e]; ++r)
        for (int64_t c = 0; c < kOut; ++c) want[r * kOut + c] += bias[c];
    const std::vector<float> rows(got.begin() + at * kOut, got.begin() + (at + kRows[e]) * kOut);
    EXPECT_LE(relative_error(rows, want), 1e-2) << "expert " << e;
    at += kRows[e];
  }
}

// Widths that are not a multiple of 8 (rows of 36 and 20 bf16: not 16-byte multiples) never reach
// cuBLAS's grouped kernels, which load 16 bytes at a time: they run one by one, right.
TEST_F(CudaGroupedGemm, WidthsNotAMultipleOf8RunOneByOne) {
  const Experts x(allocator_, seed_, 36, 20);
  DeviceArray<__nv_bfloat16> out16(allocator_, std::vector<__nv_bfloat16>(x.total * x.oc, __float2bfloat16(NAN)));
  std::vector<PrecisionGemm> gemms;
  int64_t at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    PrecisionGemm g = expert_gemm(x, LinearGemm::Forward, e, at);
    g.out16 = out16.ptr + at * x.oc;
    gemms.push_back(g);
    at += kRows[e];
  }
  const GroupedGemmCounts before = grouped_gemm_counts();
  {
    const Grouping grouping(true);
    precision_linear_gemms(kGpu, gemms.data(), static_cast<int64_t>(gemms.size()));
  }
  EXPECT_EQ(grouped_gemm_counts().grouped, before.grouped);
  const std::vector<float> got = to_float(out16.host());
  at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    const std::vector<float> rows(got.begin() + at * x.oc, got.begin() + (at + kRows[e]) * x.oc);
    EXPECT_LE(relative_error(rows, reference(x, LinearGemm::Forward, e, at)), 1e-2) << "expert " << e;
    at += kRows[e];
  }
}

// One call holding all three output kinds (an MoE backward's dgrads and wgrads together) and an
// expert of zero rows: each kind grouped apart (weight gradients where cuBLAS takes fp32 outputs),
// the empty GEMM writing nothing.
TEST_F(CudaGroupedGemm, OutputKindsMixedInOneCallAreEachGrouped) {
  const Experts x(allocator_, seed_);
  DeviceArray<__nv_bfloat16> din16(allocator_, std::vector<__nv_bfloat16>(x.total * kIn, __float2bfloat16(NAN)));
  DeviceFloats din(allocator_, std::vector<float>(x.total * kIn, NAN));
  std::vector<std::unique_ptr<DeviceFloats>> grads;
  std::vector<PrecisionGemm> gemms;
  int64_t at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    PrecisionGemm dgrad = expert_gemm(x, LinearGemm::DataGrad, e, at);
    dgrad.rounding = OutputRounding::Bf16;
    if (e % 2 == 0) {
      dgrad.out16 = din16.ptr + at * kIn;
    } else {
      dgrad.out = din.ptr + at * kIn;
    }
    grads.push_back(std::make_unique<DeviceFloats>(allocator_, std::vector<float>(kOut * kIn, NAN)));
    PrecisionGemm wgrad = expert_gemm(x, LinearGemm::WeightGrad, e, at);
    wgrad.out = grads.back()->ptr;
    wgrad.rounding = OutputRounding::None;
    gemms.push_back(dgrad);
    gemms.push_back(wgrad);
    at += kRows[e];
  }
  PrecisionGemm empty = gemms[0];
  empty.n = 0;
  gemms.push_back(empty);
  const GroupedGemmCounts before = grouped_gemm_counts();
  {
    const Grouping grouping(true);
    precision_linear_gemms(kGpu, gemms.data(), static_cast<int64_t>(gemms.size()));
  }
  const GroupedGemmCounts after = grouped_gemm_counts();
  EXPECT_EQ(after.grouped - before.grouped + after.refused - before.refused, 3);
  EXPECT_GE(after.grouped - before.grouped, 2) << "the bf16 and rounded dgrads (cuBLAS's reason on stderr)";
  const std::vector<float> got16 = to_float(din16.host()), got32 = din.host();
  at = 0;
  for (size_t e = 0; e < kRows.size(); ++e) {
    const std::vector<float>& got = e % 2 == 0 ? got16 : got32;
    const std::vector<float> rows(got.begin() + at * kIn, got.begin() + (at + kRows[e]) * kIn);
    EXPECT_LE(relative_error(rows, reference(x, LinearGemm::DataGrad, e, at)), 1e-2) << "dgrad " << e;
    EXPECT_LE(relative_error(grads[e]->host(), reference(x, LinearGemm::WeightGrad, e, at)), 1e-5) << "wgrad " << e;
    at += kRows[e];
  }
}

// LOOM_GROUPED_GEMM_ROWS's range: a clear error outside it, without a GPU too.
TEST(CudaGroupedGemmSetting, RowsOutsideTheRangeAreErrors) {
  EXPECT_THROW(set_grouped_gemm_most_rows(-2), Error);
  EXPECT_THROW(set_grouped_gemm_most_rows((int64_t{1} << 20) + 1), Error);
  set_grouped_gemm_most_rows(7);
  EXPECT_EQ(grouped_gemm_most_rows(), 7);
  set_grouped_gemm_most_rows(0);
  EXPECT_EQ(grouped_gemm_most_rows(), 0);
  set_grouped_gemm_most_rows(-1);
}

}  // namespace
}  // namespace loom::kernels::cuda
