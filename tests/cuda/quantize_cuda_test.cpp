// The device quantisation of the precision recipes against loom::precision's CPU reference, bit
// for bit: per-tensor FP8 (E4M3, E5M2) encode, decode and round trip, amax; blockwise 1 x 128
// runs and 128 x 128 tiles with their scales; MXFP8 along rows (codes, E8M0 scales, round trip)
// and down columns. Inputs span many binades, with subnormals, values past the format's range,
// signed zeros, and a NaN and an Inf in their own blocks; the device amax and per-tensor scale of
// the FP8 GEMMs. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"
#include "loom/precision/mx.h"

namespace loom::kernels::cuda {
namespace {

using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;

// Values over about 2^-30 .. 2^20 with random signs, some zeros, subnormal-range values, and
// (when `specials`) a NaN at 5 and an Inf at 1000.
std::vector<float> wide_values(uint32_t seed, int64_t n, bool specials) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> exponent(-30.0f, 20.0f), mantissa(1.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float x = std::ldexp(mantissa(rng), static_cast<int>(exponent(rng)));
    if (rng() % 2) x = -x;
    if (rng() % 50 == 0) x = (rng() % 2) ? 0.0f : -0.0f;
    v[static_cast<size_t>(i)] = x;
  }
  if (specials && n > 1000) {
    v[5] = NAN;
    v[1000] = INFINITY;
  }
  return v;
}

// Equal as bit patterns, NaNs of any payload counted equal.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool same = std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]) ||
                      (std::isnan(got[i]) && std::isnan(want[i]));
    if (!same && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

precision::Fp8Format cpu_format(Fp8 f) { return f == Fp8::E4M3 ? precision::Fp8Format::E4M3 : precision::Fp8Format::E5M2; }

class CudaQuantize : public testing::GpuTest<::testing::TestWithParam<Fp8>> {};

// The packed transposed cast's tile rows (cast.h's set_tiled_cast_rows) while in scope, the default
// after.
struct TiledCastRows {
  explicit TiledCastRows(int rows) { set_tiled_cast_rows(rows); }
  ~TiledCastRows() { set_tiled_cast_rows(0); }
  TiledCastRows(const TiledCastRows&) = delete;
  TiledCastRows& operator=(const TiledCastRows&) = delete;
};

TEST_P(CudaQuantize, PerTensorCastsEqualTheCpu) {
  const Fp8 f = GetParam();
  const int64_t n = 100003;
  const std::vector<float> x = wide_values(seed_, n, true);
  const float scale = 3.75f;
  std::vector<uint8_t> codes(n);
  precision::encode_fp8(x.data(), codes.data(), n, cpu_format(f), scale);
  std::vector<float> decoded(n), round_trip = x;
  precision::decode_fp8(codes.data(), decoded.data(), n, cpu_format(f), 1.0f / scale);
  precision::quantize_dequantize_fp8(round_trip.data(), n, cpu_format(f), scale);
  DeviceFloats d_x(allocator_, x), d_decoded(allocator_, poison(n)), d_rt(allocator_, x);
  DeviceArray<uint8_t> d_codes(allocator_, std::vector<uint8_t>(n, 0xAB));
  encode_fp8(d_x.ptr, d_codes.ptr, n, f, scale);
  decode_fp8(d_codes.ptr, d_decoded.ptr, n, f, 1.0f / scale);
  quantize_dequantize_fp8(d_rt.ptr, n, f, scale);
  EXPECT_EQ(d_codes.host(), codes);
  expect_same_bits(d_decoded.host(), decoded, "decode");
  expect_same_bits(d_rt.host(), round_trip, "round trip");
  const std::vector<float> finite = wide_values(seed_ + 1, n, false);
  DeviceFloats d_finite(allocator_, finite);
  EXPECT_EQ(amax(d_finite.ptr, n), precision::amax(finite.data(), n));
  EXPECT_TRUE(std::isnan(amax(d_x.ptr, n)));
}

TEST_P(CudaQuantize, BlockwiseRunsAndTilesEqualTheCpu) {
  const Fp8 f = GetParam();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 300}, {257, 1000}}) {
    const std::vector<float> x = wide_values(seed_, rows * cols, rows * cols > 1000);
    const int64_t runs = rows * ((cols + 127) / 128), tiles = ((rows + 127) / 128) * ((cols + 127) / 128);
    std::vector<float> rowwise = x, tiled = x, run_scales(runs), tile_scales(tiles);
    precision::quantize_dequantize_rowwise_blocks(rowwise.data(), rows, cols, cpu_format(f), 128, run_scales.data());
    precision::quantize_dequantize_tile_blocks(tiled.data(), rows, cols, cpu_format(f), 128, tile_scales.data());
    DeviceFloats d_rowwise(allocator_, x), d_tiled(allocator_, x), d_run_scales(allocator_, poison(runs)),
        d_tile_scales(allocator_, poison(tiles)), d_inverse(allocator_, poison(runs));
    DeviceArray<uint8_t> d_codes(allocator_, std::vector<uint8_t>(rows * cols, 0xAB));
    quantize_dequantize_rowwise_blocks(d_rowwise.ptr, rows, cols, f, d_run_scales.ptr);
    quantize_dequantize_tile_blocks(d_tiled.ptr, rows, cols, f, d_tile_scales.ptr);
    expect_same_bits(d_rowwise.host(), rowwise, "1 x 128 runs");
    expect_same_bits(d_run_scales.host(), run_scales, "1 x 128 scales");
    expect_same_bits(d_tiled.host(), tiled, "128 x 128 tiles");
    expect_same_bits(d_tile_scales.host(), tile_scales, "128 x 128 scales");
    // The GEMM's encoding: codes of x * scale per run, and 1 / scale.
    DeviceFloats d_x(allocator_, x);
    encode_rowwise_blocks(d_x.ptr, d_codes.ptr, d_inverse.ptr, rows, cols, f);
    const std::vector<uint8_t> codes = d_codes.host();
    const std::vector<float> inverse = d_inverse.host();
    for (int64_t r = 0, bad = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float scale = run_scales[r * ((cols + 127) / 128) + c / 128];
        // An Inf or NaN element is encoded as NaN, so the product shows it (precision_gemm.h).
        const float v = x[r * cols + c];
        const uint8_t want = precision::float_to_fp8(std::isfinite(v) ? v * scale : NAN, cpu_format(f));
        if (codes[r * cols + c] != want && bad++ < 5) ADD_FAILURE() << "code at " << r << ", " << c;
      }
    }
    // Scale inverses in cuBLASLt's layout: [blocks along the row, rows].
    const int64_t per_row = (cols + 127) / 128;
    for (int64_t i = 0; i < runs; ++i)
      EXPECT_EQ(inverse[(i % per_row) * rows + i / per_row], 1.0f / run_scales[i]) << "run " << i;
    // Tiles: [tile rows, tile columns padded to 4].
    DeviceFloats d_tile_inverse(allocator_, poison(blockwise_tile_scale_count(rows, cols)));
    encode_tile_blocks(d_x.ptr, d_codes.ptr, d_tile_inverse.ptr, rows, cols, f);
    const std::vector<float> tile_inverse = d_tile_inverse.host();
    const int64_t tile_cols = (cols + 127) / 128;
    for (int64_t i = 0; i < tiles; ++i)
      EXPECT_EQ(tile_inverse[(i / tile_cols) * blockwise_tile_stride(cols) + i % tile_cols], 1.0f / tile_scales[i])
          << "tile " << i;
    // The padding of each row of scales is zero, not what the buffer held.
    for (int64_t i = 0; i < static_cast<int64_t>(tile_inverse.size()); ++i) {
      if (i % blockwise_tile_stride(cols) >= tile_cols) {
        EXPECT_EQ(tile_inverse[i], 0.0f) << "padding at " << i;
      }
    }
  }
}

TEST_P(CudaQuantize, MxBlocksAlongRowsAndDownColumnsEqualTheCpu) {
  const Fp8 f = GetParam();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {130, 1000}}) {
    const std::vector<float> x = wide_values(seed_, rows * cols, rows * cols > 1000);
    const int64_t blocks = rows * ((cols + 31) / 32);
    std::vector<uint8_t> codes(rows * cols), scales(blocks);
    precision::encode_mx(x.data(), rows, cols, cpu_format(f), codes.data(), scales.data());
    std::vector<float> decoded(rows * cols), along_rows = x, down_columns = x;
    precision::decode_mx(codes.data(), scales.data(), rows, cols, cpu_format(f), decoded.data());
    precision::quantize_dequantize_mx(along_rows.data(), rows, cols, cpu_format(f));
    precision::quantize_dequantize_mx_columns(down_columns.data(), rows, cols, cpu_format(f));
    DeviceFloats d_x(allocator_, x), d_decoded(allocator_, poison(rows * cols)), d_rows(allocator_, x),
        d_columns(allocator_, x);
    DeviceArray<uint8_t> d_codes(allocator_, std::vector<uint8_t>(rows * cols, 0xAB)),
        d_scales(allocator_, std::vector<uint8_t>(blocks, 0xAB));
    encode_mx(d_x.ptr, rows, cols, f, d_codes.ptr, d_scales.ptr);
    decode_mx(d_codes.ptr, d_scales.ptr, rows, cols, f, d_decoded.ptr);
    quantize_dequantize_mx(d_rows.ptr, rows, cols, f);
    quantize_dequantize_mx_columns(d_columns.ptr, rows, cols, f);
    EXPECT_EQ(d_codes.host(), codes) << rows << " x " << cols;
    EXPECT_EQ(d_scales.host(), scales) << rows << " x " << cols;
    expect_same_bits(d_decoded.host(), decoded, "MX decode");
    expect_same_bits(d_rows.host(), along_rows, "MX along rows");
    expect_same_bits(d_columns.host(), down_columns, "MX down columns");
  }
}

// The FP8 recipes' device-side amax and per-tensor scale (no read back in the GEMMs): amax_into
// accumulates precision::amax into what the float holds (a NaN or Inf staying), at awkward sizes
// (the largest beyond one pass of its capped grid, amax.cuh's kAmaxBlocks), on 4-element packs
// and, one element off their alignment, one element at a time;
// fp8_tensor_scale is precision::compute_scale(amax, fp8 max, margin, 1) bit for bit, with its
// rounded inverse, over zero, subnormal, ordinary, huge and non-finite amaxes and several
// margins; the per-tensor GEMM cast with that device scale writes the CPU's codes, and an Inf or
// NaN element as NaN.
TEST_P(CudaQuantize, DeviceAmaxAndTensorScaleEqualTheCpu) {
  const Fp8 f = GetParam();
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1000}, int64_t{100003}, int64_t{3000017}}) {
    const std::vector<float> x = wide_values(seed_ + static_cast<uint32_t>(n), n, false);
    const float want = precision::amax(x.data(), n);
    for (float start : {0.0f, want * 0.5f, want * 2.0f, INFINITY, NAN}) {
      DeviceFloats d_x(allocator_, x), d_max(allocator_, std::vector<float>{start});
      amax_into(d_max.ptr, d_x.ptr, n);
      const float got = d_max.host()[0];
      if (std::isnan(start)) {
        EXPECT_TRUE(std::isnan(got)) << n;
      } else {
        EXPECT_EQ(got, std::max(start, want)) << n << " from " << start;
      }
    }
    if (n > 1) {  // one element past the packs' alignment: the one-element loop
      DeviceFloats d_x(allocator_, x), d_max(allocator_, std::vector<float>{0.0f});
      amax_into(d_max.ptr, d_x.ptr + 1, n - 1);
      EXPECT_EQ(d_max.host()[0], precision::amax(x.data() + 1, n - 1)) << n << " off the alignment";
    }
  }
  std::vector<float> specials = wide_values(seed_, 2000, true);  // a NaN at 5, an Inf at 1000
  DeviceFloats d_specials(allocator_, specials), d_nan(allocator_, std::vector<float>{0.0f});
  amax_into(d_nan.ptr, d_specials.ptr, 2000);
  EXPECT_TRUE(std::isnan(d_nan.host()[0]));
  specials[5] = 1.0f;
  DeviceFloats d_inf_only(allocator_, specials), d_inf(allocator_, std::vector<float>{0.0f});
  amax_into(d_inf.ptr, d_inf_only.ptr, 2000);
  EXPECT_TRUE(std::isinf(d_inf.host()[0]));
  // A NaN or an Inf among 3M elements, where each thread loads four packs at a time.
  std::vector<float> large = wide_values(seed_ + 9, 3000017, false);
  large[1234567] = INFINITY;
  DeviceFloats d_large_inf(allocator_, large), d_large_inf_max(allocator_, std::vector<float>{0.0f});
  amax_into(d_large_inf_max.ptr, d_large_inf.ptr, static_cast<int64_t>(large.size()));
  EXPECT_TRUE(std::isinf(d_large_inf_max.host()[0]));
  large[2345678] = NAN;
  DeviceFloats d_large_nan(allocator_, large), d_large_nan_max(allocator_, std::vector<float>{0.0f});
  amax_into(d_large_nan_max.ptr, d_large_nan.ptr, static_cast<int64_t>(large.size()));
  EXPECT_TRUE(std::isnan(d_large_nan_max.host()[0]));

  const float fp8_max = precision::max_finite(cpu_format(f));
  const std::vector<float> amaxes = {0.0f,    -0.0f,   1e-45f, 1e-40f, 3.1e-38f, 1e-30f, 0.37f,  1.0f, 448.0f,
                                     57344.0f, 1.7e37f, 3e38f,  FLT_MAX, INFINITY, NAN};
  for (int margin : {0, 1, 3, 40}) {
    for (float a : amaxes) {
      DeviceFloats d_amax(allocator_, std::vector<float>{a}), d_scale(allocator_, poison(kFp8ScalePairFloats)),
          d_first(allocator_, poison(kFp8ScalePairFloats)), d_copy(allocator_, poison(kFp8ScalePairFloats));
      fp8_tensor_scale(d_amax.ptr, 7.0f, margin, f, d_scale.ptr);
      const std::vector<float> got = d_scale.host();
      const float want = precision::compute_scale(a, fp8_max, margin, 1.0f);
      EXPECT_EQ(std::bit_cast<uint32_t>(got[0]), std::bit_cast<uint32_t>(want)) << "amax " << a << " margin " << margin;
      EXPECT_EQ(std::bit_cast<uint32_t>(got[kFp8InverseOffset]), std::bit_cast<uint32_t>(1.0f / want)) << "amax " << a;
      // The pair into two places by one launch: both the same bits as the one above.
      fp8_tensor_scale_twice(d_amax.ptr, 7.0f, margin, f, d_first.ptr, d_copy.ptr);
      for (const std::vector<float>& pair : {d_first.host(), d_copy.host()}) {
        EXPECT_EQ(std::bit_cast<uint32_t>(pair[0]), std::bit_cast<uint32_t>(want)) << "twice, amax " << a;
        EXPECT_EQ(std::bit_cast<uint32_t>(pair[kFp8InverseOffset]), std::bit_cast<uint32_t>(1.0f / want))
            << "twice, amax " << a;
      }
    }
  }
  DeviceFloats d_host_scale(allocator_, poison(kFp8ScalePairFloats));
  fp8_tensor_scale(nullptr, 0.125f, 0, f, d_host_scale.ptr);  // fp8_delayed: the host's scale
  EXPECT_EQ(d_host_scale.host()[0], 0.125f);
  EXPECT_EQ(d_host_scale.host()[kFp8InverseOffset], 8.0f);

  // The per-tensor GEMM cast, transposed on the way, with the scale from the device amax.
  const int64_t rows = 37, cols = 91;
  const std::vector<float> x = wide_values(seed_ + 7, rows * cols, false);
  std::vector<float> with_specials = x;
  with_specials[3] = NAN;
  with_specials[rows * cols - 2] = -INFINITY;
  DeviceFloats d_x(allocator_, with_specials), d_amax(allocator_, std::vector<float>{0.0f}),
      d_scale(allocator_, poison(kFp8ScalePairFloats));
  amax_into(d_amax.ptr, d_x.ptr, rows * cols);
  const float amax_finite = precision::amax(x.data(), rows * cols);
  DeviceFloats d_finite_amax(allocator_, std::vector<float>{amax_finite});
  fp8_tensor_scale(d_finite_amax.ptr, 1.0f, 2, f, d_scale.ptr);
  const float scale = precision::compute_scale(amax_finite, fp8_max, 2, 1.0f);
  DeviceArray<uint8_t> d_codes(allocator_, std::vector<uint8_t>(rows * cols, 0xAB));
  cast_operand(d_x.ptr, d_codes.ptr, rows, cols, true, f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2, d_scale.ptr);
  const std::vector<uint8_t> codes = d_codes.host();
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = with_specials[r * cols + c];
      const uint8_t want = precision::float_to_fp8(std::isfinite(v) ? v * scale : NAN, cpu_format(f));
      if (codes[c * rows + r] != want && bad++ < 5) ADD_FAILURE() << "code of " << r << ", " << c;
    }
  }
  EXPECT_EQ(bad, 0);

  // Both orientations from one read (an activation cast once for two GEMMs): each the bytes of
  // its own cast_operand.
  const CastTo to = f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2;
  DeviceArray<uint8_t> d_plain(allocator_, std::vector<uint8_t>(rows * cols, 0xCD));
  DeviceArray<uint8_t> d_both(allocator_, std::vector<uint8_t>(rows * cols, 0xEF));
  DeviceArray<uint8_t> d_both_t(allocator_, std::vector<uint8_t>(rows * cols, 0x12));
  cast_operand(d_x.ptr, d_plain.ptr, rows, cols, false, to, d_scale.ptr);
  cast_operand_both(d_x.ptr, d_both.ptr, d_both_t.ptr, rows, cols, to, d_scale.ptr);
  EXPECT_EQ(d_both.host(), d_plain.host());
  EXPECT_EQ(d_both_t.host(), codes);

  // From a bf16 tensor (an activation kept bf16): the amax and both casts of the fp32 tensor
  // holding its values, bit for bit.
  const std::vector<float> x16_values = testing::bf16_rounded(with_specials);
  DeviceFloats d_wide(allocator_, x16_values), d_amax16(allocator_, std::vector<float>{0.0f}),
      d_amax32(allocator_, std::vector<float>{0.0f});
  DeviceArray<__nv_bfloat16> d_x16(allocator_, testing::to_bf16(x16_values));
  amax_into(d_amax32.ptr, d_wide.ptr, rows * cols);
  amax_into_bf16(d_amax16.ptr, d_x16.ptr, rows * cols);
  EXPECT_TRUE(std::isnan(d_amax16.host()[0]) && std::isnan(d_amax32.host()[0]));  // the NaN at 3
  DeviceArray<uint8_t> d_from32(allocator_, std::vector<uint8_t>(rows * cols, 0x34));
  DeviceArray<uint8_t> d_from32_t(allocator_, std::vector<uint8_t>(rows * cols, 0x56));
  DeviceArray<uint8_t> d_from16(allocator_, std::vector<uint8_t>(rows * cols, 0x78));
  DeviceArray<uint8_t> d_from16_t(allocator_, std::vector<uint8_t>(rows * cols, 0x9A));
  cast_operand_both(d_wide.ptr, d_from32.ptr, d_from32_t.ptr, rows, cols, to, d_scale.ptr);
  cast_operand_both_bf16(d_x16.ptr, d_from16.ptr, d_from16_t.ptr, rows, cols, to, d_scale.ptr);
  EXPECT_EQ(d_from16.host(), d_from32.host());
  EXPECT_EQ(d_from16_t.host(), d_from32_t.host());
  std::vector<float> finite16 = x16_values;
  finite16[3] = 1.0f;
  finite16[rows * cols - 2] = 2.0f;
  DeviceArray<__nv_bfloat16> d_finite16(allocator_, testing::to_bf16(finite16));
  DeviceFloats d_finite_max(allocator_, std::vector<float>{0.0f});
  amax_into_bf16(d_finite_max.ptr, d_finite16.ptr, rows * cols);
  EXPECT_EQ(d_finite_max.host()[0], precision::amax(finite16.data(), rows * cols));
}

// fp8_delayed's casts take the operand's amax from the read that casts it (CastOperand::amax_out):
// the same codes as without, and the amax_into of what they read added into a running value;
// NaN wins, then Inf. Plain, transposed, both orientations, and from bf16; shapes not multiples of
// the tiles (32 x 32, or 64 x 64 where rows and columns are multiples of 4), and large enough that
// blocks walk several tiles (the capped grid: 131108 x 4's 2049 tiles) or grid-stride several times
// (3M elements).
TEST_P(CudaQuantize, CastsTakingTheAmaxWriteTheSameCodesAndTheAmaxOfWhatTheyRead) {
  const Fp8 f = GetParam();
  const CastTo to = f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2;
  DeviceFloats d_scale(allocator_, std::vector<float>{0.25f, 4.0f});
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{37, 91}, {1000, 4100}, {131108, 4}, {3000017, 1}}) {
    const int64_t n = rows * cols;
    for (const int special : {0, 1, 2}) {  // none, an Inf, an Inf and a NaN
      std::vector<float> x = wide_values(seed_ + 11, n, false);
      if (special >= 1) x[static_cast<size_t>(n - 1)] = -INFINITY;  // the last tile's last element
      if (special == 2) x[static_cast<size_t>(n / 3)] = NAN;
      const float want = special == 2 ? NAN : special == 1 ? INFINITY : precision::amax(x.data(), n);
      const std::string name = std::to_string(rows) + " x " + std::to_string(cols) + " special " +
                               std::to_string(special);
      DeviceFloats d_x(allocator_, x);
      const std::vector<float> x16_values = testing::bf16_rounded(x);
      DeviceArray<__nv_bfloat16> d_x16(allocator_, testing::to_bf16(x16_values));
      const float want16 = special == 0 ? precision::amax(x16_values.data(), n) : want;
      auto codes = [&](uint8_t fill) { return DeviceArray<uint8_t>(allocator_, std::vector<uint8_t>(n, fill)); };
      auto expect_amax = [&](const DeviceFloats& got, float expected, const std::string& what) {
        const float g = got.host()[0];
        EXPECT_TRUE(std::bit_cast<uint32_t>(g) == std::bit_cast<uint32_t>(expected) ||
                    (std::isnan(g) && std::isnan(expected)))
            << name << " " << what << ": amax " << g << ", want " << expected;
      };
      for (const bool transpose : {false, true}) {
        DeviceArray<uint8_t> plain = codes(0x11), taking = codes(0x22);
        DeviceFloats amax(allocator_, std::vector<float>{1e-30f});
        cast_operand(d_x.ptr, plain.ptr, rows, cols, transpose, to, d_scale.ptr);
        cast_operand(d_x.ptr, taking.ptr, rows, cols, transpose, to, d_scale.ptr, nullptr, amax.ptr);
        EXPECT_EQ(taking.host(), plain.host()) << name << (transpose ? " transposed" : " plain");
        expect_amax(amax, want, transpose ? "transposed" : "plain");
      }
      // A running amax above every finite value stays, unless a NaN or Inf comes.
      DeviceArray<uint8_t> both = codes(0x33), both_t = codes(0x44), want_both = codes(0), want_t = codes(0);
      DeviceFloats big(allocator_, std::vector<float>{FLT_MAX});
      cast_operand_both(d_x.ptr, want_both.ptr, want_t.ptr, rows, cols, to, d_scale.ptr);
      cast_operand_both(d_x.ptr, both.ptr, both_t.ptr, rows, cols, to, d_scale.ptr, nullptr, big.ptr);
      EXPECT_EQ(both.host(), want_both.host()) << name;
      EXPECT_EQ(both_t.host(), want_t.host()) << name;
      expect_amax(big, special == 0 ? FLT_MAX : want, "both orientations over a running FLT_MAX");
      DeviceArray<uint8_t> from16 = codes(0x55), from16_t = codes(0x66), want16_codes = codes(0),
                           want16_t = codes(0);
      DeviceFloats amax16(allocator_, std::vector<float>{0.0f});
      cast_operand_both_bf16(d_x16.ptr, want16_codes.ptr, want16_t.ptr, rows, cols, to, d_scale.ptr);
      cast_operand_both_bf16(d_x16.ptr, from16.ptr, from16_t.ptr, rows, cols, to, d_scale.ptr, nullptr, amax16.ptr);
      EXPECT_EQ(from16.host(), want16_codes.host()) << name << " bf16";
      EXPECT_EQ(from16_t.host(), want16_t.host()) << name << " bf16";
      expect_amax(amax16, want16, "bf16");
    }
  }
}

// The transposed casts (tiled_cast.cuh: 64 x 64 tiles four elements per access where rows, columns
// and pointers allow, 32 x 32 tiles one element at a time otherwise) against the plain cast of
// the same input transposed on the host, byte for byte: every output type, from fp32 and bf16, one
// orientation or both at once, with the amax taken or not (then amax_into's of the input), and
// the same with 128-row packed tiles (FP8 codes; the other outputs keep 64). Shapes with a partial
// last tile each way (100 x 132; 1100 x 68 at either height), rows over several 128-row tiles (260
// x 132), not multiples of 4, a single pack; pointers at and one element off the packs' alignment.
// Nothing is written outside the output.
TEST_P(CudaQuantize, TransposedCastsAreThePlainCastTransposed) {
  const Fp8 f = GetParam();
  DeviceFloats d_scale(allocator_, std::vector<float>{0.25f, 4.0f});
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{100, 132}, {37, 91}, {100, 130}, {102, 132}, {4, 4},
                                   {1100, 68}, {260, 132}}) {
    const int64_t n = rows * cols;
    for (const int64_t offset : {0, 1}) {  // elements before the input and each output
      const std::vector<float> x = wide_values(seed_ + 13, n + offset, n > 1000);
      const std::vector<float> x16_values = testing::bf16_rounded(x);
      DeviceFloats d_x(allocator_, x), d_x16_values(allocator_, x16_values);
      DeviceArray<__nv_bfloat16> d_x16(allocator_, testing::to_bf16(x16_values));
      DeviceFloats want_amax(allocator_, std::vector<float>{0.0f});
      amax_into(want_amax.ptr, d_x.ptr + offset, n);
      for (const CastTo to : {CastTo::F32, CastTo::BF16, CastTo::F16, f == Fp8::E4M3 ? CastTo::E4M3 : CastTo::E5M2}) {
        const int64_t size = to == CastTo::F32 ? 4 : to == CastTo::BF16 || to == CastTo::F16 ? 2 : 1;
        const std::string shape_name = std::to_string(rows) + " x " + std::to_string(cols) + " offset " +
                                       std::to_string(offset) + " cast " + std::to_string(static_cast<int>(to));
        std::string name = shape_name;  // and the tile rows below
        // An output of n elements after `offset` ones, 4 more after it; all filled with `fill`.
        auto output = [&](uint8_t fill) {
          return DeviceArray<uint8_t>(allocator_, std::vector<uint8_t>((offset + n + 4) * size, fill));
        };
        auto at = [&](const DeviceArray<uint8_t>& a) { return a.ptr + offset * size; };
        // The output's n elements, and whether every byte around them is still `fill`.
        auto written = [&](const DeviceArray<uint8_t>& a, uint8_t fill) {
          const std::vector<uint8_t> b = a.host();
          const auto first = b.begin() + offset * size, last = first + n * size;
          EXPECT_TRUE(std::all_of(b.begin(), first, [&](uint8_t v) { return v == fill; }) &&
                      std::all_of(last, b.end(), [&](uint8_t v) { return v == fill; }))
              << name << ": a byte outside the output";
          return std::vector<uint8_t>(first, last);
        };
        auto transposed = [&](const std::vector<uint8_t>& b) {
          std::vector<uint8_t> t(b.size());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              std::memcpy(&t[(c * rows + r) * size], &b[(r * cols + c) * size], size);
          return t;
        };
        DeviceArray<uint8_t> plain = output(0x11), plain16 = output(0x12);
        cast_operand(d_x.ptr + offset, at(plain), rows, cols, false, to, d_scale.ptr);
        cast_operand(d_x16_values.ptr + offset, at(plain16), rows, cols, false, to, d_scale.ptr);
        const std::vector<uint8_t> want = written(plain, 0x11), want16 = written(plain16, 0x12);
        const std::vector<uint8_t> want_t = transposed(want), want16_t = transposed(want16);

        for (const int tile_rows : {64, 128}) {
          const TiledCastRows tiles(tile_rows);
          name = shape_name + " tile rows " + std::to_string(tile_rows);
          DeviceArray<uint8_t> t = output(0x21);
          cast_operand(d_x.ptr + offset, at(t), rows, cols, true, to, d_scale.ptr);
          EXPECT_EQ(written(t, 0x21), want_t) << name << ": transposed";
          DeviceArray<uint8_t> both = output(0x31), both_t = output(0x32);
          cast_operand_both(d_x.ptr + offset, at(both), at(both_t), rows, cols, to, d_scale.ptr);
          EXPECT_EQ(written(both, 0x31), want) << name << ": both, as it lies";
          EXPECT_EQ(written(both_t, 0x32), want_t) << name << ": both, transposed";
          DeviceArray<uint8_t> taking = output(0x41), taking_t = output(0x42);
          DeviceFloats amax(allocator_, std::vector<float>{0.0f});
          cast_operand_both(d_x.ptr + offset, at(taking), at(taking_t), rows, cols, to, d_scale.ptr, nullptr,
                            amax.ptr);
          EXPECT_EQ(written(taking, 0x41), want) << name << ": taking the amax, as it lies";
          EXPECT_EQ(written(taking_t, 0x42), want_t) << name << ": taking the amax, transposed";
          const float got_amax = amax.host()[0], expected_amax = want_amax.host()[0];
          EXPECT_TRUE(std::bit_cast<uint32_t>(got_amax) == std::bit_cast<uint32_t>(expected_amax) ||
                      (std::isnan(got_amax) && std::isnan(expected_amax)))
              << name << ": amax " << got_amax << ", want " << expected_amax;
          DeviceArray<uint8_t> from16 = output(0x51), from16_t = output(0x52);
          cast_operand_both_bf16(d_x16.ptr + offset, at(from16), at(from16_t), rows, cols, to, d_scale.ptr);
          EXPECT_EQ(written(from16, 0x51), want16) << name << ": from bf16, as it lies";
          EXPECT_EQ(written(from16_t, 0x52), want16_t) << name << ": from bf16, transposed";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantize, ::testing::Values(Fp8::E4M3, Fp8::E5M2),
                         [](const ::testing::TestParamInfo<Fp8>& info) {
                           return info.param == Fp8::E4M3 ? std::string("E4M3") : std::string("E5M2");
                         });

}  // namespace
}  // namespace loom::kernels::cuda
