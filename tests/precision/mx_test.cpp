// MXFP8 (OCP MX v1.0): worked blocks derived by hand from the spec's conversion rule
// X = 2^(floor(log2(amax)) - emax_elem), P_i = RNE(V_i / X) clamped to the max normal; the
// clamps and NaN handling loom chose; ragged blocks; the per-element error bound; agreement with
// an independent double-precision reference; the column-blocked variant equals the transpose.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/error.h"
#include "loom/precision/mx.h"
#include "reference.h"

namespace loom::precision {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

std::vector<float> round_trip(const std::vector<float>& v, Fp8Format format) {
  const MxBlock block = encode_mx_block(v.data(), static_cast<int>(v.size()), format);
  std::vector<float> out(v.size());
  decode_mx_block(block, format, out.data());
  return out;
}

TEST(Mx, E8M0Values) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(119), 0x1p-8f);
  EXPECT_EQ(e8m0_to_float(254), 0x1p127f);
  EXPECT_EQ(e8m0_to_float(1), 0x1p-126f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);  // no zero in E8M0: the smallest scale
  EXPECT_TRUE(std::isnan(e8m0_to_float(kE8M0Nan)));
  for (int b = 0; b < 255; ++b) EXPECT_EQ(e8m0_to_float(static_cast<uint8_t>(b)), std::ldexp(1.0f, b - 127)) << b;
}

// amax 1.0 in E4M3: floor(log2 1) - 8 = -8, X = 2^-8, P_i = V_i * 256.
TEST(Mx, AmaxOneGivesScaleTwoToMinusEight) {
  const std::vector<float> v = {1.0f, 0.5f, -0.25f, 0.3f, -1.0f, 0.0f};
  const MxBlock block = encode_mx_block(v.data(), 6, Fp8Format::E4M3);
  EXPECT_EQ(block.scale_bits, 127 - 8);
  EXPECT_EQ(block.count, 6);
  EXPECT_EQ(block.elements[0], 0x78);  // 256 = 2^8: exponent field 8 + 7 = 15, mantissa 0
  EXPECT_EQ(e4m3_to_float(block.elements[1]), 128.0f);
  EXPECT_EQ(e4m3_to_float(block.elements[2]), -64.0f);
  // 0.3 * 256 = 76.8 lies in [64, 128) where E4M3 steps by 8: nearest is 80.
  EXPECT_EQ(e4m3_to_float(block.elements[3]), 80.0f);
  EXPECT_EQ(block.elements[4], 0xf8);
  EXPECT_EQ(block.elements[5], 0x00);
  const auto out = round_trip(v, Fp8Format::E4M3);
  EXPECT_EQ(out[3], 80.0f / 256.0f);
  EXPECT_EQ(out[0], 1.0f);
  // E5M2: emax_elem 15, so X = 2^-15 and 0.3 * 2^15 = 9830.4 -> steps of 2048 in [8192, 16384): 10240.
  const MxBlock e5 = encode_mx_block(v.data(), 6, Fp8Format::E5M2);
  EXPECT_EQ(e5.scale_bits, 127 - 15);
  EXPECT_EQ(e5m2_to_float(e5.elements[3]), 10240.0f);
}

// amax = 448 * 2^k: floor(log2) = 8 + k, so X = 2^k and the maximum is exactly E4M3's 448.
TEST(Mx, AmaxAtMaxNormalTimesPowerOfTwo) {
  for (int k : {-20, -3, 0, 5, 60}) {
    std::vector<float> v(32);
    for (int i = 0; i < 32; ++i) v[static_cast<size_t>(i)] = std::ldexp(static_cast<float>(i) - 16.0f, k);
    v[9] = std::ldexp(-448.0f, k);
    const MxBlock block = encode_mx_block(v.data(), 32, Fp8Format::E4M3);
    EXPECT_EQ(block.scale_bits, 127 + k) << k;
    EXPECT_EQ(block.elements[9], 0xfe) << k;  // -448
    const auto out = round_trip(v, Fp8Format::E4M3);
    for (size_t i = 0; i < 32; ++i) EXPECT_EQ(out[i], v[i]) << k << " " << i;  // small integers * 2^k: exact
  }
}

// The floor leaves amax / X in [256, 512) for E4M3: above 448 (+ half a step) the spec clamps.
TEST(Mx, ElementsPastMaxNormalSaturate) {
  const std::vector<float> v = {500.0f, -510.0f, 460.0f, 1.0f};
  const MxBlock block = encode_mx_block(v.data(), 4, Fp8Format::E4M3);
  EXPECT_EQ(block.scale_bits, 127);  // floor(log2 510) = 8, minus 8
  const auto out = round_trip(v, Fp8Format::E4M3);
  EXPECT_EQ(out[0], 448.0f);
  EXPECT_EQ(out[1], -448.0f);
  EXPECT_EQ(out[2], 448.0f);  // 460 rounds to 448 (next would be 480)
  EXPECT_EQ(out[3], 1.0f);
}

// All zeros: log2(0) = -inf clamps to E8M0's smallest exponent, -127; elements stay (signed) zeros.
TEST(Mx, AllZeroBlock) {
  const std::vector<float> v = {0.0f, -0.0f, 0.0f, 0.0f, -0.0f};
  const MxBlock block = encode_mx_block(v.data(), 5, Fp8Format::E4M3);
  EXPECT_EQ(block.scale_bits, 0);
  const auto out = round_trip(v, Fp8Format::E4M3);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(bits(out[i]), bits(v[i])) << i;
  // A tiny but nonzero amax below 2^-119 clamps too: X = 2^-127 and V / X still fits E4M3.
  const std::vector<float> tiny = {0x1p-125f, -0x1p-126f, 3 * 0x1p-130f};
  const MxBlock t = encode_mx_block(tiny.data(), 3, Fp8Format::E4M3);
  EXPECT_EQ(t.scale_bits, 0);
  const auto tiny_out = round_trip(tiny, Fp8Format::E4M3);
  for (size_t i = 0; i < tiny.size(); ++i) EXPECT_EQ(tiny_out[i], tiny[i]) << i;
}

// One outlier sets X for all 32: small neighbours fall below half the smallest subnormal and flush.
TEST(Mx, OutlierFlushesSmallElementsToZero) {
  std::vector<float> v(32, 1e-3f);
  v[0] = 1e4f;   // floor(log2 1e4) = 13 -> X = 2^5 = 32
  v[1] = -2e-2f;  // 6.25e-4 after scaling: below 2^-10 -> -0
  v[2] = 0.05f;  // 1.5625e-3 after scaling: above 2^-10 -> 2^-9 -> 2^-9 * 32 = 0.0625
  const MxBlock block = encode_mx_block(v.data(), 32, Fp8Format::E4M3);
  EXPECT_EQ(block.scale_bits, 127 + 5);
  const auto out = round_trip(v, Fp8Format::E4M3);
  EXPECT_EQ(out[0], 10240.0f);  // 1e4 / 32 = 312.5 -> steps of 32 in [256, 512): 320
  EXPECT_EQ(bits(out[1]), bits(-0.0f));
  EXPECT_EQ(out[2], 0.0625f);
  for (size_t i = 3; i < 32; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  // The same small values without the outlier keep their precision.
  std::vector<float> alone(v.begin() + 3, v.end());
  const auto alone_out = round_trip(alone, Fp8Format::E4M3);
  for (float x : alone_out) EXPECT_NEAR(x, 1e-3f, 1e-3f * 0x1p-4f);
}

// NaN or Inf anywhere: X = NaN, so the whole block reads NaN (and the codes say NaN too).
TEST(Mx, NonFiniteBlockHasNanScale) {
  for (float bad : {kNan, kInf, -kInf}) {
    std::vector<float> v(32, 1.0f);
    v[17] = bad;
    for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      const MxBlock block = encode_mx_block(v.data(), 32, format);
      EXPECT_EQ(block.scale_bits, kE8M0Nan);
      for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(fp8_to_float(block.elements[static_cast<size_t>(i)], format)));
      const auto out = round_trip(v, format);
      for (float x : out) EXPECT_TRUE(std::isnan(x));
    }
  }
  // In a matrix only that block is affected.
  std::vector<float> m(2 * 64, 0.75f);
  m[40] = kNan;  // row 0, second block
  quantize_dequantize_mx(m.data(), 2, 64, Fp8Format::E4M3);
  for (int c = 0; c < 64; ++c) {
    EXPECT_EQ(std::isnan(m[static_cast<size_t>(c)]), c >= 32) << c;
    EXPECT_EQ(m[static_cast<size_t>(64 + c)], 0.75f) << c;
  }
}

// cols = 39: a full block of 32 and a ragged block of 7 with its own scale.
TEST(Mx, RaggedLastBlockUsesItsOwnScale) {
  std::vector<float> row(39);
  for (int i = 0; i < 32; ++i) row[static_cast<size_t>(i)] = 1000.0f + static_cast<float>(i);
  for (int i = 32; i < 39; ++i) row[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i - 31);
  auto q = row;
  quantize_dequantize_mx(q.data(), 1, 39, Fp8Format::E4M3);
  std::vector<uint8_t> codes(39), scales(2);
  encode_mx(row.data(), 1, 39, Fp8Format::E4M3, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 127 + 10 - 8);  // floor(log2 1031) = 10
  EXPECT_EQ(scales[1], 127 - 8 - 8);   // 0.007 = 1.792 * 2^-8
  const std::vector<float> tail(row.begin() + 32, row.end());
  const auto tail_out = round_trip(tail, Fp8Format::E4M3);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(q[static_cast<size_t>(32 + i)], tail_out[static_cast<size_t>(i)]) << i;
    EXPECT_NEAR(q[static_cast<size_t>(32 + i)], row[static_cast<size_t>(32 + i)], row[static_cast<size_t>(32 + i)] * 0x1p-4f);
  }
  std::vector<float> decoded(39);
  decode_mx(codes.data(), scales.data(), 1, 39, Fp8Format::E4M3, decoded.data());
  for (int i = 0; i < 39; ++i) EXPECT_EQ(bits(decoded[static_cast<size_t>(i)]), bits(q[static_cast<size_t>(i)])) << i;
  EXPECT_THROW(encode_mx_block(row.data(), 33, Fp8Format::E4M3), Error);
  EXPECT_THROW(encode_mx_block(row.data(), 0, Fp8Format::E4M3), Error);
}

// Random rows spanning many binades, against a reference computed in double: X from log2 and
// the element by a nearest-value search; plus the error bound the format promises per element:
// unsaturated, |x - q| <= max(|x| 2^-(M+1), X * min_subnormal / 2); saturated, q = +-max * X.
TEST(Mx, MatchesDoubleReferenceAndErrorBound) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<double> log2_magnitude(-12.0, 12.0);
  std::uniform_real_distribution<double> block_offset(-60.0, 60.0);
  const int64_t rows = 64, cols = 32 * 5 + 11;
  std::vector<float> data(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b * 32 < cols; ++b) {
      const double offset = block_offset(rng);
      for (int64_t c = b * 32; c < std::min(cols, b * 32 + 32); ++c) {
        data[static_cast<size_t>(r * cols + c)] = static_cast<float>((rng() & 1 ? -1 : 1) * std::exp2(offset + log2_magnitude(rng)));
      }
    }
  }
  for (Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const testing::FormatSpec& spec = format == Fp8Format::E4M3 ? testing::kE4M3 : testing::kE5M2;
    auto q = data;
    quantize_dequantize_mx(q.data(), rows, cols, format);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b * 32 < cols; ++b) {
        const int64_t c0 = b * 32, c1 = std::min(cols, c0 + 32);
        double amax = 0.0;
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(data[static_cast<size_t>(r * cols + c)])));
        const double shared = std::clamp(std::floor(std::log2(amax)) - max_normal_exponent(format), -127.0, 127.0);
        const double x_scale = std::exp2(shared);
        for (int64_t c = c0; c < c1; ++c) {
          const double v = data[static_cast<size_t>(r * cols + c)];
          const double expected = testing::reference_decode(spec, testing::reference_encode_saturating(spec, v / x_scale)) * x_scale;
          const double got = q[static_cast<size_t>(r * cols + c)];
          ASSERT_EQ(got, expected) << fp8_format_name(format) << " r " << r << " c " << c;
          const double scaled = std::fabs(v) / x_scale;
          const double max = max_finite(format);
          if (scaled > max) {
            ASSERT_EQ(std::fabs(got), max * x_scale);
          } else {
            const double bound = std::max(std::fabs(v) * std::ldexp(1.0, -(mantissa_bits(format) + 1)),
                                          x_scale * min_subnormal(format) / 2);
            ASSERT_LE(std::fabs(got - v), bound) << fp8_format_name(format) << " r " << r << " c " << c;
          }
        }
      }
    }
  }
}

// Blocks down the columns equal transposing, blocking along rows, and transposing back.
TEST(Mx, ColumnBlocksEqualTransposedRowBlocks) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{75, 300}, {32, 7}, {1, 513}, {1100, 40}}) {
    std::mt19937 rng(static_cast<uint32_t>(rows * 7 + cols));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> a(static_cast<size_t>(rows * cols));
    for (auto& x : a) x = normal(rng) * std::exp2(static_cast<float>(rng() % 20) - 10.0f);
    a[static_cast<size_t>(cols / 2)] = kNan;
    std::vector<float> t(a.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
    quantize_dequantize_mx_columns(a.data(), rows, cols, Fp8Format::E4M3);
    quantize_dequantize_mx(t.data(), cols, rows, Fp8Format::E4M3);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float x = a[static_cast<size_t>(r * cols + c)], y = t[static_cast<size_t>(c * rows + r)];
        ASSERT_TRUE(bits(x) == bits(y) || (std::isnan(x) && std::isnan(y))) << rows << "x" << cols << " r " << r << " c " << c;
      }
    }
  }
}

}  // namespace
}  // namespace loom::precision
