// core/dtype_convert.h against exact, hand-derived bit patterns: ties, subnormals, the largest
// finite values, overflow, infinities, NaN and negative zero, for bf16 and fp16.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"

namespace loom {
namespace {

float f(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

struct Case {
  uint32_t in;   // f32 bits
  uint16_t out;  // expected narrow bits
  const char* what;
};

TEST(DTypeConvert, F32ToBf16ExactCases) {
  const Case cases[] = {
      {0x00000000u, 0x0000u, "+0"},
      {0x80000000u, 0x8000u, "-0 keeps its sign"},
      {0x3f800000u, 0x3f80u, "1"},
      {0x3f808000u, 0x3f80u, "tie, even neighbour below"},
      {0x3f818000u, 0x3f82u, "tie, odd neighbour below: up"},
      {0x3f808001u, 0x3f81u, "just above a tie"},
      {0x3f807fffu, 0x3f80u, "just below a tie"},
      {0xbf818000u, 0xbf82u, "negative tie"},
      {0x00000001u, 0x0000u, "smallest f32 subnormal"},
      {0x00008000u, 0x0000u, "subnormal tie to even (0)"},
      {0x00018000u, 0x0002u, "subnormal tie to even (2)"},
      {0x00010000u, 0x0001u, "smallest bf16 subnormal"},
      {0x807fffffu, 0x8080u, "largest negative subnormal rounds to -min normal"},
      {0x00800000u, 0x0080u, "min normal"},
      {0x7f7f0000u, 0x7f7fu, "max finite"},
      {0x7f7f7fffu, 0x7f7fu, "below the tie above max finite"},
      {0x7f7f8000u, 0x7f80u, "tie above max finite: overflow to Inf"},
      {0x7f7fffffu, 0x7f80u, "f32 max: overflow to Inf"},
      {0xff7fffffu, 0xff80u, "-f32 max: overflow to -Inf"},
      {0x7f800000u, 0x7f80u, "Inf"},
      {0xff800000u, 0xff80u, "-Inf"},
      {0x7fc00000u, 0x7fc0u, "quiet NaN"},
      {0xffc00000u, 0xffc0u, "negative quiet NaN"},
      {0x7f800001u, 0x7fc0u, "NaN with only low payload bits stays NaN (quieted)"},
      {0x7fffffffu, 0x7fffu, "NaN with every payload bit set does not carry into the sign"},
  };
  for (const Case& c : cases) EXPECT_EQ(f32_to_bf16(f(c.in)), c.out) << c.what;
}

TEST(DTypeConvert, Bf16ToF32IsExact) {
  EXPECT_EQ(bits(bf16_to_f32(0x0001u)), 0x00010000u);  // 2^-133
  EXPECT_EQ(bits(bf16_to_f32(0x8000u)), 0x80000000u);
  EXPECT_EQ(bits(bf16_to_f32(0x7f7fu)), 0x7f7f0000u);  // 3.3895314e38
  EXPECT_EQ(bf16_to_f32(0x7f80u), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bf16_to_f32(0xff80u), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_f32(0x7f81u)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(0xffc0u)));
  for (uint32_t code = 0; code < 65536; ++code) {  // every non-NaN code survives a round trip
    const float x = bf16_to_f32(static_cast<uint16_t>(code));
    if (!std::isnan(x)) {
      ASSERT_EQ(f32_to_bf16(x), code) << std::hex << code;
    }
  }
}

TEST(DTypeConvert, F32ToF16ExactCases) {
  const Case cases[] = {
      {bits(0.0f), 0x0000u, "+0"},
      {bits(-0.0f), 0x8000u, "-0 keeps its sign"},
      {bits(1.0f), 0x3c00u, "1"},
      {bits(1.0f + 0x1p-11f), 0x3c00u, "tie, even neighbour below"},
      {bits(1.0f + 3 * 0x1p-11f), 0x3c02u, "tie, odd neighbour below: up"},
      {bits(1.0f + 0x1p-11f) + 1, 0x3c01u, "just above a tie"},
      {bits(-1.0f - 3 * 0x1p-11f), 0xbc02u, "negative tie"},
      {bits(0x1p-24f), 0x0001u, "smallest fp16 subnormal"},
      {bits(-0x1p-24f), 0x8001u, "negative smallest subnormal"},
      {bits(0x1p-25f), 0x0000u, "half the smallest subnormal: tie to even (0)"},
      {bits(0x1p-25f) + 1, 0x0001u, "just above that tie"},
      {bits(-0x1p-25f), 0x8000u, "negative tie to zero keeps the sign"},
      {bits(3 * 0x1p-25f), 0x0002u, "1.5 quanta: tie to even (2)"},
      {bits(1023 * 0x1p-24f), 0x03ffu, "largest subnormal"},
      {bits(0x1p-14f - 0x1p-25f), 0x0400u, "tie between the largest subnormal and min normal: even"},
      {bits(0x1p-14f), 0x0400u, "min normal"},
      {0x00000001u, 0x0000u, "f32 subnormal underflows to 0"},
      {0x80000001u, 0x8000u, "negative f32 subnormal underflows to -0"},
      {bits(65504.0f), 0x7bffu, "max finite"},
      {bits(65520.0f) - 1, 0x7bffu, "just below the tie above max finite"},
      {bits(65520.0f), 0x7c00u, "tie above max finite: overflow to Inf"},
      {bits(-65520.0f), 0xfc00u, "negative overflow to -Inf"},
      {bits(1e10f), 0x7c00u, "far overflow"},
      {0x7f7fffffu, 0x7c00u, "f32 max"},
      {0x7f800000u, 0x7c00u, "Inf"},
      {0xff800000u, 0xfc00u, "-Inf"},
      {0x7fc00000u, 0x7e00u, "quiet NaN"},
      {0xffc00000u, 0xfe00u, "negative quiet NaN"},
      {0x7f800001u, 0x7e00u, "NaN with only low payload bits stays NaN (quieted)"},
      {0x7fffe000u, 0x7fffu, "NaN payload's top bits kept"},
  };
  for (const Case& c : cases) EXPECT_EQ(f32_to_f16(f(c.in)), c.out) << c.what;
}

TEST(DTypeConvert, F16ToF32IsExact) {
  EXPECT_EQ(f16_to_f32(0x0001u), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03ffu), 1023 * 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x0400u), 0x1p-14f);
  EXPECT_EQ(f16_to_f32(0x7bffu), 65504.0f);
  EXPECT_EQ(f16_to_f32(0xfbffu), -65504.0f);
  EXPECT_EQ(bits(f16_to_f32(0x8000u)), 0x80000000u);
  EXPECT_EQ(bits(f16_to_f32(0x8001u)), bits(-0x1p-24f));
  EXPECT_EQ(f16_to_f32(0x7c00u), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xfc00u), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7c01u)));  // signalling NaN stays NaN
  EXPECT_TRUE(std::isnan(f16_to_f32(0xfe00u)));
  for (uint32_t code = 0; code < 65536; ++code) {  // every non-NaN code survives a round trip
    const float x = f16_to_f32(static_cast<uint16_t>(code));
    if (!std::isnan(x)) {
      ASSERT_EQ(f32_to_f16(x), code) << std::hex << code;
    }
  }
}

TEST(DTypeConvert, ArrayFormsMatchTheScalarOnesAtAnyAlignment) {
  std::vector<float> values;
  for (uint32_t i = 0; i < 1000; ++i) values.push_back(f(i * 0x9e3779b9u));
  values.push_back(65520.0f);
  values.push_back(-0.0f);
  const int64_t n = static_cast<int64_t>(values.size());
  for (DType dtype : {DType::BF16, DType::F16}) {
    std::vector<unsigned char> narrow(2 * values.size() + 1);
    unsigned char* odd = narrow.data() + 1;  // deliberately misaligned
    from_f32(odd, values.data(), n, dtype);
    std::vector<float> wide(values.size());
    to_f32(wide.data(), odd, n, dtype);
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t code = static_cast<uint16_t>(odd[2 * i] | (odd[2 * i + 1] << 8));
      const float x = values[static_cast<size_t>(i)];
      const uint16_t want = dtype == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      const float back = dtype == DType::BF16 ? bf16_to_f32(want) : f16_to_f32(want);
      if (std::isnan(x)) {
        ASSERT_TRUE(std::isnan(wide[static_cast<size_t>(i)])) << i;
      } else {
        ASSERT_EQ(code, want) << dtype_name(dtype) << " [" << i << "]";
        ASSERT_EQ(bits(wide[static_cast<size_t>(i)]), bits(back)) << dtype_name(dtype) << " [" << i << "]";
      }
    }
  }
  float x = 1.0f;
  EXPECT_THROW(to_f32(&x, &x, 1, DType::I32), Error);
  EXPECT_THROW(from_f32(&x, &x, 1, DType::F8E4M3), Error);
}

}  // namespace
}  // namespace loom
