// The scalar and array casts of formats.h: a worked example, every code of every format
// against the textbook formula, round trips, ties to even at every midpoint, and the boundaries
// (max normal, subnormals, underflow to signed zero, overflow under both policies, Inf, NaN).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/error.h"
#include "loom/precision/formats.h"
#include "reference.h"

namespace loom::precision {
namespace {

using testing::FormatSpec;
using testing::kBf16;
using testing::kE4M3;
using testing::kE5M2;
using testing::kFp16;
using testing::reference_decode;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// The cast under test for each format, by spec.
uint32_t encode(const FormatSpec& f, float x, Overflow overflow) {
  if (&f == &kE4M3) return float_to_e4m3(x, overflow);
  if (&f == &kE5M2) return float_to_e5m2(x, overflow);
  if (&f == &kFp16) return float_to_fp16(x, overflow);
  return float_to_bf16(x, overflow);
}
float decode(const FormatSpec& f, uint32_t code) {
  if (&f == &kE4M3) return e4m3_to_float(static_cast<uint8_t>(code));
  if (&f == &kE5M2) return e5m2_to_float(static_cast<uint8_t>(code));
  if (&f == &kFp16) return fp16_to_float(static_cast<uint16_t>(code));
  return bf16_to_float(static_cast<uint16_t>(code));
}

const FormatSpec* const kAll[] = {&kE4M3, &kE5M2, &kFp16, &kBf16};

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// A worked example: 0.395264 (exactly the fp16 value 0.395263671875, bits 0 01101 1001010011)
// becomes bf16 0 01111101 1001010 = 0.394531, E4M3 0 0101 101 = 0.40625, E5M2 0 01101 10 = 0.375.
TEST(Formats, SeedWorkedExample) {
  const float x = 0.395264f;
  EXPECT_EQ(float_to_fp16(x), 0x3653);
  EXPECT_EQ(fp16_to_float(0x3653), 0.395263671875f);
  EXPECT_EQ(float_to_bf16(x), 0x3eca);
  EXPECT_EQ(bf16_to_float(float_to_bf16(x)), 0.39453125f);
  EXPECT_NEAR(bf16_to_float(float_to_bf16(x)), 0.394531f, 1e-6);
  EXPECT_EQ(float_to_e4m3(x), 0x2d);
  EXPECT_EQ(e4m3_to_float(float_to_e4m3(x)), 0.40625f);
  EXPECT_EQ(float_to_e5m2(x), 0x36);
  EXPECT_EQ(e5m2_to_float(float_to_e5m2(x)), 0.375f);
  // Starting from the fp16 value itself gives the same narrower codes.
  EXPECT_EQ(float_to_bf16(fp16_to_float(0x3653)), 0x3eca);
  EXPECT_EQ(float_to_e4m3(fp16_to_float(0x3653)), 0x2d);
  EXPECT_EQ(float_to_e5m2(fp16_to_float(0x3653)), 0x36);
}

TEST(Formats, FormatConstants) {
  EXPECT_EQ(max_finite(Fp8Format::E4M3), 448.0f);
  EXPECT_EQ(max_finite(Fp8Format::E5M2), 57344.0f);
  EXPECT_EQ(min_subnormal(Fp8Format::E4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(min_subnormal(Fp8Format::E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(min_normal(Fp8Format::E4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(min_normal(Fp8Format::E5M2), std::ldexp(1.0f, -14));
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    // Each constant is the decoded value of the code the formula says it is.
    const FormatSpec& spec = f == Fp8Format::E4M3 ? kE4M3 : kE5M2;
    const uint32_t max_code = f == Fp8Format::E4M3 ? 0x7e : 0x7b;
    EXPECT_EQ(max_finite(f), reference_decode(spec, max_code)) << fp8_format_name(f);
    EXPECT_EQ(min_subnormal(f), reference_decode(spec, 1)) << fp8_format_name(f);
    EXPECT_EQ(min_normal(f), reference_decode(spec, 1u << spec.mantissa_bits)) << fp8_format_name(f);
    EXPECT_EQ(std::ilogb(max_finite(f)), max_normal_exponent(f));
  }
}

// Every code decodes to the formula's value (bit for bit, as the values are exact in fp32), and
// casting that value back gives the same code; NaN codes decode to NaN and come back as NaN.
TEST(Formats, EveryCodeDecodesToFormulaAndRoundTrips) {
  for (const FormatSpec* f : kAll) {
    int nan_codes = 0;
    for (uint32_t code = 0; code < (1u << f->bits); ++code) {
      const double expected = reference_decode(*f, code);
      const float value = decode(*f, code);
      if (std::isnan(expected)) {
        ++nan_codes;
        ASSERT_TRUE(std::isnan(value)) << f->name << " code " << code;
        for (Overflow o : {Overflow::Saturate, Overflow::NonSaturating}) {
          ASSERT_TRUE(testing::is_nan_code(*f, encode(*f, value, o))) << f->name << " code " << code;
        }
        continue;
      }
      ASSERT_EQ(static_cast<double>(value), expected) << f->name << " code " << code;
      ASSERT_EQ(std::signbit(value), std::signbit(expected)) << f->name << " code " << code;
      ASSERT_EQ(encode(*f, value, Overflow::NonSaturating), code) << f->name << " code " << code;
      if (std::isfinite(expected)) {
        ASSERT_EQ(encode(*f, value, Overflow::Saturate), code) << f->name << " code " << code;
      }
    }
    // E4M3: only S.1111.111 (0x7f, 0xff); E5M2: 2 x 3; fp16: 2 x 1023; bf16: 2 x 127.
    const int expected_nans = f == &kE4M3 ? 2 : 2 * ((1 << f->mantissa_bits) - 1);
    EXPECT_EQ(nan_codes, expected_nans) << f->name;
  }
  // E4M3's two NaN codes are exactly S.1111.111.
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x78), 256.0f);  // S.1111.000 is a normal number in E4M3, not Inf
}

// Between every pair of adjacent finite values: the midpoint goes to the even code, anything
// nearer one side goes to that side. For both signs.
TEST(Formats, MidpointsRoundToEvenEverywhere) {
  for (const FormatSpec* f : kAll) {
    const auto codes = testing::finite_magnitude_codes(*f);
    const uint32_t sign = 1u << (f->bits - 1);
    for (size_t i = 0; i + 1 < codes.size(); ++i) {
      const uint32_t lo = codes[i], hi = codes[i + 1];
      const double vlo = reference_decode(*f, lo), vhi = reference_decode(*f, hi);
      const float mid = static_cast<float>((vlo + vhi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (vlo + vhi) / 2) << "midpoint not exact in fp32";
      const uint32_t even = (lo & 1u) == 0 ? lo : hi;
      for (Overflow o : {Overflow::Saturate, Overflow::NonSaturating}) {
        ASSERT_EQ(encode(*f, mid, o), even) << f->name << " between codes " << lo << " and " << hi;
        ASSERT_EQ(encode(*f, -mid, o), sign | even) << f->name << " between codes " << lo << " and " << hi;
        ASSERT_EQ(encode(*f, std::nextafter(mid, 0.0f), o), lo) << f->name << " just below the midpoint";
        ASSERT_EQ(encode(*f, std::nextafter(mid, kInf), o), hi) << f->name << " just above the midpoint";
        ASSERT_EQ(encode(*f, -std::nextafter(mid, kInf), o), sign | hi) << f->name;
      }
    }
  }
}

// Random values over the whole range of each 8-bit format against a brute-force nearest search.
TEST(Formats, Fp8MatchesNearestValueSearch) {
  std::mt19937 rng(5);
  for (const FormatSpec* f : {&kE4M3, &kE5M2}) {
    std::uniform_real_distribution<double> log2_magnitude(-f->bias - f->mantissa_bits - 3.0, f->bias + 3.0);
    for (int i = 0; i < 20000; ++i) {
      const float x = static_cast<float>((i % 2 ? -1.0 : 1.0) * std::exp2(log2_magnitude(rng)));
      ASSERT_EQ(encode(*f, x, Overflow::Saturate), testing::reference_encode_saturating(*f, x))
          << f->name << " x = " << x;
    }
  }
}

TEST(Formats, Fp8Boundaries) {
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const std::string name = fp8_format_name(format);
    const float max = max_finite(format), tiny = min_subnormal(format);
    auto round = [&](float x, Overflow o = Overflow::Saturate) { return fp8_to_float(float_to_fp8(x, format, o), format); };
    EXPECT_EQ(round(max), max) << name;
    EXPECT_EQ(round(-max), -max) << name;
    EXPECT_EQ(round(min_normal(format)), min_normal(format)) << name;
    EXPECT_EQ(round(tiny), tiny) << name;
    EXPECT_EQ(round(-tiny), -tiny) << name;
    // Half the smallest subnormal is a tie between 0 (even) and it; below half: signed zero.
    EXPECT_EQ(bits(round(tiny / 2)), bits(0.0f)) << name;
    EXPECT_EQ(bits(round(-tiny / 2)), bits(-0.0f)) << name;
    EXPECT_EQ(round(std::nextafter(tiny / 2, 1.0f)), tiny) << name;
    EXPECT_EQ(bits(round(tiny / 3)), bits(0.0f)) << name;
    EXPECT_EQ(bits(round(-1e-30f)), bits(-0.0f)) << name;
    EXPECT_EQ(bits(round(-std::numeric_limits<float>::denorm_min())), bits(-0.0f)) << name;
    EXPECT_EQ(float_to_fp8(-0.0f, format), 0x80) << name;
    EXPECT_EQ(float_to_fp8(0.0f, format), 0x00) << name;
    // Overflow and infinities: Saturate clamps to +-max; NonSaturating gives Inf (E5M2) or NaN (E4M3).
    for (float big : {2 * max, 1e30f, std::numeric_limits<float>::max(), kInf}) {
      EXPECT_EQ(round(big), max) << name << " " << big;
      EXPECT_EQ(round(-big), -max) << name << " " << big;
      const float non_saturated = round(big, Overflow::NonSaturating);
      if (format == Fp8Format::E5M2) {
        EXPECT_EQ(non_saturated, kInf) << name << " " << big;
        EXPECT_EQ(round(-big, Overflow::NonSaturating), -kInf) << name << " " << big;
      } else {
        EXPECT_TRUE(std::isnan(non_saturated)) << name << " " << big;
      }
    }
    EXPECT_TRUE(std::isnan(round(kNan)));
    EXPECT_TRUE(std::isnan(round(-kNan)));
    EXPECT_TRUE(std::isnan(round(kNan, Overflow::NonSaturating)));
  }
  // The overflow thresholds are the midpoints past max: E4M3 464 is a tie that goes to the even
  // code 448; anything above would round to 480, which E4M3 does not have.
  EXPECT_EQ(float_to_e4m3(464.0f, Overflow::NonSaturating), 0x7e);
  EXPECT_TRUE(std::isnan(e4m3_to_float(float_to_e4m3(std::nextafter(464.0f, 1e9f), Overflow::NonSaturating))));
  EXPECT_EQ(float_to_e4m3(std::nextafter(464.0f, 1e9f), Overflow::Saturate), 0x7e);
  // E5M2 57344 = 1.75 * 2^15 has an odd code: the tie 61440 goes up, to Inf.
  EXPECT_EQ(float_to_e5m2(std::nextafter(61440.0f, 0.0f), Overflow::NonSaturating), 0x7b);
  EXPECT_EQ(float_to_e5m2(61440.0f, Overflow::NonSaturating), 0x7c);
  EXPECT_EQ(float_to_e5m2(61440.0f, Overflow::Saturate), 0x7b);
  // Subnormal to normal carry: just under the smallest normal rounds up into it.
  EXPECT_EQ(float_to_e4m3(std::nextafter(0x1p-6f, 0.0f)), 0x08);
  EXPECT_EQ(float_to_e4m3(0x1p-6f - 0x1p-10f), 0x08);  // tie between 0x07 (odd) and 0x08
}

TEST(Formats, HalfPrecisionBoundaries) {
  // fp16: 65504 max, overflow threshold 65520 (tie, goes to Inf), subnormals down to 2^-24.
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16(65520.0f, Overflow::Saturate), 0x7bff);
  EXPECT_EQ(float_to_fp16(-kInf), 0xfc00);
  EXPECT_EQ(float_to_fp16(-kInf, Overflow::Saturate), 0xfbff);
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);                         // tie to even (0)
  EXPECT_EQ(float_to_fp16(-0x1p-25f), 0x8000);                        // signed zero
  EXPECT_EQ(float_to_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_fp16(3 * 0x1p-25f), 0x0002);                     // 1.5 quanta: tie to even 2
  EXPECT_EQ(float_to_fp16(1.0f + 0x1p-11f), 0x3c00);                  // tie to even (1.0)
  EXPECT_EQ(float_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);              // tie to even (odd 0x3c01 loses)
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);                         // min normal
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(kNan))));
  EXPECT_EQ(fp16_to_float(float_to_fp16(kInf)), kInf);
  // bf16: ties to even on the 16 dropped bits; overflow to Inf or to max; subnormals kept.
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, odd goes up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max(), Overflow::Saturate), 0x7f7f);
  EXPECT_EQ(float_to_bf16(-kInf, Overflow::Saturate), 0xff7f);
  EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie to even
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kNan))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // NaN payload in low bits only
}

std::vector<float> wide_random_values(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> log2_magnitude(-30.0f, 20.0f);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& x : out) x = (rng() & 1 ? -1.0f : 1.0f) * std::exp2(log2_magnitude(rng));
  out[3] = kNan;
  out[5] = kInf;
  out[7] = -0.0f;
  return out;
}

// The array helpers equal the scalar casts element by element, serial and OpenMP sizes.
TEST(Formats, ArrayHelpersMatchScalarCasts) {
  for (int64_t n : {int64_t{37}, int64_t{100003}}) {
    const auto input = wide_random_values(n, 11);
    auto bf16 = input, fp16 = input;
    round_to_bf16(bf16.data(), n);
    round_to_fp16(fp16.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(bf16[i]), bits(bf16_to_float(float_to_bf16(input[i])))) << i;
      ASSERT_EQ(bits(fp16[i]), bits(fp16_to_float(float_to_fp16(input[i])))) << i;
    }
    for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      const float scale = 3.0f;
      auto q = input;
      quantize_dequantize_fp8(q.data(), n, format, scale);
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      std::vector<float> decoded(static_cast<size_t>(n));
      encode_fp8(input.data(), codes.data(), n, format, scale);
      decode_fp8(codes.data(), decoded.data(), n, format, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t code = float_to_fp8(input[i] * scale, format);
        ASSERT_EQ(codes[i], code) << fp8_format_name(format) << " " << i;
        const float expected = fp8_to_float(code, format) / scale;
        if (std::isnan(expected)) {
          ASSERT_TRUE(std::isnan(q[i])) << i;
          ASSERT_TRUE(std::isnan(decoded[i])) << i;
          continue;
        }
        ASSERT_EQ(bits(q[i]), bits(expected)) << fp8_format_name(format) << " " << i;
        ASSERT_EQ(bits(decoded[i]), bits(fp8_to_float(code, format))) << fp8_format_name(format) << " " << i;
      }
    }
  }
}

// What a representable value stays: quantize-dequantize with a power-of-two scale is the identity
// on values the format holds at that scale, and rounding is idempotent.
TEST(Formats, QuantizeDequantizeIsExactOnRepresentableValues) {
  std::vector<float> values;
  for (uint32_t code = 0; code < 256; ++code) {
    const float v = e4m3_to_float(static_cast<uint8_t>(code));
    if (!std::isnan(v)) values.push_back(v / 16.0f);
  }
  auto q = values;
  quantize_dequantize_fp8(q.data(), static_cast<int64_t>(q.size()), Fp8Format::E4M3, 16.0f);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(bits(q[i]), bits(values[i])) << i;
  auto twice = wide_random_values(1000, 3);
  round_to_bf16(twice.data(), 1000);
  auto again = twice;
  round_to_bf16(again.data(), 1000);
  for (size_t i = 0; i < 1000; ++i) {
    if (!std::isnan(twice[i])) {
      ASSERT_EQ(bits(again[i]), bits(twice[i])) << i;
    }
  }
  EXPECT_THROW(quantize_dequantize_fp8(q.data(), 1, Fp8Format::E4M3, 0.0f), Error);
  EXPECT_THROW(quantize_dequantize_fp8(q.data(), 1, Fp8Format::E4M3, kInf), Error);
}

}  // namespace
}  // namespace loom::precision
