// The reduction helpers shared by the backends (reduce.h): conversions against independent
// oracles (the compiler's _Float16 for f16, rounding in double for bf16), bulk paths against the
// scalar ones, and the N-way reduction's order, aliasing, Avg, Max and single rounding.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

uint64_t next(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// bf16 rounding done in double: 8 significant bits (spacing 2^-133 below the normal range),
// ties to even (the default rounding of nearbyint), overflow to infinity.
uint16_t bf16_oracle(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value) || std::isinf(value) || value == 0.0f) return static_cast<uint16_t>(bits >> 16);
  int exponent = 0;
  std::frexp(static_cast<double>(value), &exponent);
  const double quantum = std::ldexp(1.0, std::max(exponent - 8, -133));
  const double rounded = std::nearbyint(value / quantum) * quantum;
  const double largest = (2.0 - 0x1p-7) * 0x1p127;
  if (std::abs(rounded) > largest) return static_cast<uint16_t>((bits & 0x80000000u) >> 16 | 0x7f80u);
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(rounded)) >> 16);
}

std::vector<float> awkward_floats() {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f,
                               0x1p-14f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 3 * 0x1p-26f, 0x1.ffcp-15f,
                               std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               1.00390625f /* bf16 tie */, 1.01171875f /* bf16 tie, odd */};
  uint64_t state = 42;
  for (int i = 0; i < 1 << 20; ++i) values.push_back(std::bit_cast<float>(static_cast<uint32_t>(next(state))));
  return values;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(Reduce, F16ToF32MatchesTheCompilerOnEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    ASSERT_TRUE(same(f16_to_f32(static_cast<uint16_t>(h)), want)) << std::hex << h;
  }
}

TEST(Reduce, F32ToF16RoundsToNearestEvenLikeTheCompiler) {
  for (float f : awkward_floats()) {
    const uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const uint16_t got = f32_to_f16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu) != 0) << f;
    } else {
      ASSERT_EQ(got, want) << std::hexfloat << f;
    }
  }
}

TEST(Reduce, Bf16ConversionsRoundToNearestEven) {
  for (float f : awkward_floats()) {
    const uint16_t got = f32_to_bf16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(got))) << "NaN must stay NaN";
    } else {
      ASSERT_EQ(got, bf16_oracle(f)) << std::hexfloat << f;
      ASSERT_EQ(std::bit_cast<uint32_t>(bf16_to_f32(got)), static_cast<uint32_t>(got) << 16);
    }
  }
}

TEST(Reduce, BulkConversionsMatchTheScalarOnes) {
  std::vector<float> values = awkward_floats();
  values.resize(1000 + 3);  // not a multiple of the vector width
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> narrow(values.size());
    from_f32(narrow.data(), values.data(), static_cast<int64_t>(values.size()), dtype);
    std::vector<float> wide(values.size());
    to_f32(wide.data(), narrow.data(), static_cast<int64_t>(values.size()), dtype);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t scalar = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
      const float back = dtype == DType::BF16 ? bf16_to_f32(narrow[i]) : f16_to_f32(narrow[i]);
      if (std::isnan(values[i])) {
        ASSERT_TRUE(std::isnan(back));
      } else {
        ASSERT_EQ(narrow[i], scalar) << dtype_name(dtype) << " [" << i << "]";
      }
      ASSERT_TRUE(same(wide[i], back)) << dtype_name(dtype) << " [" << i << "]";
    }
  }
}

TEST(Reduce, ReduceNSumsInSourceOrderAndMayWriteIntoASource) {
  const int64_t count = 5000;  // more than one internal block
  std::vector<std::vector<float>> inputs(3, std::vector<float>(count));
  for (int64_t i = 0; i < count; ++i) {
    inputs[0][i] = 1e8f;
    inputs[1][i] = 1.0f + static_cast<float>(i % 7);
    inputs[2][i] = -1e8f;
  }
  const void* srcs[] = {inputs[0].data(), inputs[1].data(), inputs[2].data()};
  std::vector<float> sum = inputs[1];
  reduce_n(inputs[1].data(), srcs, 3, count, DType::F32, ReduceOp::Sum);  // dst is source 1
  for (int64_t i = 0; i < count; ++i) {
    // In source order (1e8 + x) - 1e8 loses x's low bits exactly as float does.
    const float want = (1e8f + sum[i]) + -1e8f;
    ASSERT_EQ(inputs[1][i], want) << i;
  }
}

TEST(Reduce, AvgMaxAndSingleRounding) {
  std::vector<uint16_t> a = {f32_to_bf16(1.0f), f32_to_bf16(-2.0f), f32_to_bf16(3.0f)};
  std::vector<uint16_t> b = {f32_to_bf16(0x1p-9f), f32_to_bf16(-4.0f), f32_to_bf16(std::nanf(""))};
  const void* srcs[] = {a.data(), b.data(), b.data(), b.data()};
  std::vector<uint16_t> out(3);
  reduce_n(out.data(), srcs, 4, 3, DType::BF16, ReduceOp::Max);
  EXPECT_EQ(bf16_to_f32(out[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(out[1]), -2.0f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(out[2]))) << "Max propagates NaN";
  reduce_n(out.data(), srcs, 4, 2, DType::BF16, ReduceOp::Avg);
  EXPECT_EQ(bf16_to_f32(out[1]), -3.5f);  // (-2 - 12) / 4
  // 1 + 3 * 2^-9 = 1.005859375 rounds once to 1.0078125; pairwise bf16 sums would stay at 1.
  reduce_n(out.data(), srcs, 4, 1, DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(bf16_to_f32(out[0]), 1.0078125f);
  std::vector<uint16_t> pairwise = {f32_to_bf16(1.0f)};
  for (int i = 0; i < 3; ++i) reduce_into(pairwise.data(), b.data(), 1, DType::BF16, ReduceOp::Sum);
  EXPECT_EQ(bf16_to_f32(pairwise[0]), 1.0f) << "reduce_into rounds at every step, as documented";
}

TEST(Reduce, StagingThroughF32RoundsOnceAndDivides) {
  std::vector<uint16_t> x = {f32_to_f16(1.0f), f32_to_f16(6.0f)};
  std::vector<uint16_t> y = {f32_to_f16(0x1p-12f), f32_to_f16(2.0f)};
  std::vector<float> acc(2);
  to_f32(acc.data(), x.data(), 2, DType::F16);
  for (int i = 0; i < 7; ++i) accumulate(acc.data(), y.data(), 2, DType::F16, ReduceOp::Avg);
  std::vector<uint16_t> out(2);
  finish(out.data(), acc.data(), 2, DType::F16, ReduceOp::Avg, 8);
  // (1 + 7 * 2^-12) / 8 = 0.125 + 1.75 * 2^-13; f16's spacing there is 2^-13: rounds up once.
  EXPECT_EQ(f16_to_f32(out[0]), 0.125f + 0x1p-12f);
  EXPECT_EQ(f16_to_f32(out[1]), 2.5f);  // (6 + 14) / 8
}

TEST(Reduce, RejectsDtypesThatCannotBeReduced) {
  EXPECT_TRUE(reducible(DType::BF16));
  EXPECT_FALSE(reducible(DType::I32));
  try {
    check_reducible(DType::I64, "all_reduce");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "all_reduce: dtype i64 cannot be reduced (valid: f32, bf16, f16)");
  }
}

}  // namespace
}  // namespace loom::comm
