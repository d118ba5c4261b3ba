// Per-tensor FP8 scaling (amax, scale formula, delayed scaling's history window, current
// scaling) and blockwise scaling (1x128 runs, 128x128 tiles), including that an outlier costs
// precision only inside its own block.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "loom/core/error.h"
#include "loom/precision/fp8_scaling.h"

namespace loom::precision {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> normal_values(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& x : out) x = dist(rng);
  return out;
}

TEST(Fp8Scaling, AmaxSeesEverythingAndPropagatesNan) {
  for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{200001}}) {
    auto x = normal_values(n, 3);
    x[static_cast<size_t>(n / 2)] = -7.5f;
    EXPECT_EQ(amax(x.data(), n), 7.5f) << n;
    x[static_cast<size_t>(n - 1)] = kNan;  // last element, and in the last thread's part
    EXPECT_TRUE(std::isnan(amax(x.data(), n))) << n;
    x[static_cast<size_t>(n - 1)] = 0.0f;
    x[0] = -kInf;
    EXPECT_EQ(amax(x.data(), n), kInf) << n;
    x[0] = kNan;  // NaN first, then larger finite values must not replace it
    EXPECT_TRUE(std::isnan(amax(x.data(), n))) << n;
  }
  EXPECT_EQ(amax(nullptr, 0), 0.0f);
}

TEST(Fp8Scaling, ComputeScale) {
  EXPECT_EQ(compute_scale(2.0f, 448.0f), 224.0f);
  EXPECT_EQ(compute_scale(2.0f, 448.0f, 1), 112.0f);   // each unit of margin halves the scale
  EXPECT_EQ(compute_scale(2.0f, 448.0f, 3), 28.0f);
  EXPECT_EQ(compute_scale(0.0f, 448.0f, 0, 5.0f), 5.0f);  // zero amax: keep the previous scale
  EXPECT_EQ(compute_scale(kNan, 448.0f, 0, 5.0f), 5.0f);
  EXPECT_EQ(compute_scale(kInf, 448.0f, 0, 5.0f), 5.0f);
  EXPECT_EQ(compute_scale(1e-44f, 57344.0f), std::numeric_limits<float>::max());  // would overflow fp32
  EXPECT_EQ(compute_scale(57344.0f * 4, 57344.0f), 0.25f);
}

// H = 3: the scale follows the max of the last three amaxes; a peak drops out after H updates.
TEST(Fp8Scaling, DelayedScalingFollowsHistoryWindow) {
  DelayedScaling s(Fp8Format::E4M3, 3);
  EXPECT_EQ(s.scale(), 1.0f);  // before any history
  const float amaxes[] = {1.0f, 8.0f, 2.0f, 4.0f, 0.5f, 0.25f};
  const float expected_history_amax[] = {1.0f, 8.0f, 8.0f, 8.0f, 4.0f, 4.0f};
  for (int i = 0; i < 6; ++i) {
    s.update(amaxes[i]);
    EXPECT_EQ(s.history_amax(), expected_history_amax[i]) << i;
    EXPECT_EQ(s.scale(), 448.0f / expected_history_amax[i]) << i;
  }
  // Non-finite amaxes are ignored: the window and scale stay as they were.
  s.update(kInf);
  s.update(kNan);
  EXPECT_EQ(s.scale(), 448.0f / 4.0f);
  s.update(0.25f);  // window now 0.5, 0.25, 0.25
  EXPECT_EQ(s.scale(), 448.0f / 0.5f);
  EXPECT_EQ(s.scale_inverse(), 0.5f / 448.0f);
}

TEST(Fp8Scaling, DelayedScalingMarginAndMostRecent) {
  for (int margin : {0, 1, 2}) {
    DelayedScaling s(Fp8Format::E5M2, 16, margin);
    s.update(7.0f);
    EXPECT_EQ(s.scale(), std::ldexp(57344.0f / 7.0f, -margin)) << margin;
  }
  DelayedScaling recent(Fp8Format::E4M3, 4, 0, AmaxAlgorithm::MostRecent);
  recent.update(16.0f);
  recent.update(2.0f);
  EXPECT_EQ(recent.scale(), 224.0f);
  // All-zero history (a tensor that was zero so far) keeps the previous scale.
  DelayedScaling zero(Fp8Format::E4M3, 2);
  zero.update(0.0f);
  EXPECT_EQ(zero.scale(), 1.0f);
  EXPECT_THROW(DelayedScaling(Fp8Format::E4M3, 0), Error);
}

TEST(Fp8Scaling, DelayedScalingStateRoundTrips) {
  DelayedScaling a(Fp8Format::E4M3, 5, 1);
  for (float x : {3.0f, 9.0f, 1.0f}) a.update(x);
  DelayedScaling b(Fp8Format::E4M3, 5, 1);
  b.restore(a.state());
  for (float x : {0.5f, 0.25f, 0.125f, 2.0f, 0.1f, 0.1f}) {
    a.update(x);
    b.update(x);
    ASSERT_EQ(a.scale(), b.scale());
  }
  DelayedScaling wrong_length(Fp8Format::E4M3, 4);
  EXPECT_THROW(wrong_length.restore(a.state()), Error);
}

TEST(Fp8Scaling, CurrentScalingUsesTheTensorsOwnAmax) {
  auto x = normal_values(1000, 9, 0.01f);
  x[10] = -0.125f;
  const CurrentScaling current(Fp8Format::E4M3);
  EXPECT_EQ(current.scale_for(x.data(), 1000), 448.0f / 0.125f);
  auto expected = x;
  quantize_dequantize_fp8(expected.data(), 1000, Fp8Format::E4M3, 448.0f / 0.125f);
  EXPECT_EQ(current.quantize_dequantize(x.data(), 1000), 448.0f / 0.125f);
  EXPECT_EQ(x, expected);
  EXPECT_EQ(x[10], -0.125f);  // the amax element lands exactly on 448
}

// Relative error of the elements of one block, against the original values.
double max_relative_error(const std::vector<float>& original, const std::vector<float>& q, int64_t begin, int64_t end,
                          int64_t stride_rows = 0, int64_t cols = 0) {
  double worst = 0.0;
  auto visit = [&](size_t i) {
    worst = std::max(worst, std::fabs(static_cast<double>(q[i]) - original[i]) / std::fabs(static_cast<double>(original[i])));
  };
  if (stride_rows == 0) {
    for (int64_t i = begin; i < end; ++i) visit(static_cast<size_t>(i));
  } else {
    for (int64_t r = 0; r < stride_rows; ++r)
      for (int64_t c = begin; c < end; ++c) visit(static_cast<size_t>(r * cols + c));
  }
  return worst;
}

TEST(Fp8Scaling, RowwiseBlocksEachUseTheirOwnAmax) {
  const int64_t rows = 3, cols = 300;  // blocks of 128, 128, 44 per row
  auto x = normal_values(rows * cols, 5);
  for (auto& v : x) v = std::copysign(std::fabs(v) + 0.5f, v);  // keep away from zero: relative errors are meaningful
  x[1 * cols + 5] = 1e6f;                                        // an outlier in row 1, block 0
  auto q = x;
  std::vector<float> scales(static_cast<size_t>(rows * 3));
  quantize_dequantize_rowwise_blocks(q.data(), rows, cols, Fp8Format::E4M3, 128, scales.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t begin = r * cols + b * 128, end = r * cols + std::min(cols, (b + 1) * 128);
      float m = 0.0f;
      for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(x[static_cast<size_t>(i)]));
      ASSERT_EQ(scales[static_cast<size_t>(r * 3 + b)], 448.0f / m) << r << " " << b;
      // The block equals a per-tensor cast of the block alone.
      std::vector<float> alone(x.begin() + begin, x.begin() + end);
      quantize_dequantize_fp8(alone.data(), end - begin, Fp8Format::E4M3, 448.0f / m);
      for (int64_t i = begin; i < end; ++i) ASSERT_EQ(q[static_cast<size_t>(i)], alone[static_cast<size_t>(i - begin)]);
      // E4M3 keeps 3 mantissa bits for values within 2^-6 of the block max: relative error <= 2^-4.
      if (!(r == 1 && b == 0)) {
        ASSERT_LE(max_relative_error(x, q, begin, end), 0x1p-4) << r << " " << b;
      }
    }
  }
  // The outlier's own block lost its small values' precision; a per-tensor scale would have
  // done that to every block.
  EXPECT_GT(max_relative_error(x, q, cols, cols + 128), 0x1p-4);
  auto per_tensor = x;
  CurrentScaling(Fp8Format::E4M3).quantize_dequantize(per_tensor.data(), rows * cols);
  EXPECT_GT(max_relative_error(x, per_tensor, 2 * cols + 128, 2 * cols + 256), 0x1p-4);
}

TEST(Fp8Scaling, TileBlocksEachUseTheirOwnAmax) {
  const int64_t rows = 200, cols = 300;  // tiles: 2 x 3, ragged at the bottom and right
  auto w = normal_values(rows * cols, 7, 0.02f);
  for (auto& v : w) v = std::copysign(std::fabs(v) + 0.01f, v);
  w[3 * cols + 7] = 1e5f;  // an outlier in tile (0, 0): with one scale for all it would flush the rest
  auto q = w;
  std::vector<float> scales(6);
  quantize_dequantize_tile_blocks(q.data(), rows, cols, Fp8Format::E4M3, 128, scales.data());
  for (int64_t tr = 0; tr < 2; ++tr) {
    for (int64_t tc = 0; tc < 3; ++tc) {
      float m = 0.0f;
      for (int64_t r = tr * 128; r < std::min(rows, tr * 128 + 128); ++r)
        for (int64_t c = tc * 128; c < std::min(cols, tc * 128 + 128); ++c) m = std::max(m, std::fabs(w[static_cast<size_t>(r * cols + c)]));
      ASSERT_EQ(scales[static_cast<size_t>(tr * 3 + tc)], 448.0f / m) << tr << " " << tc;
      for (int64_t r = tr * 128; r < std::min(rows, tr * 128 + 128); ++r) {
        for (int64_t c = tc * 128; c < std::min(cols, tc * 128 + 128); ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          const float expected = e4m3_to_float(float_to_e4m3(w[i] * (448.0f / m))) / (448.0f / m);
          ASSERT_EQ(q[i], expected) << r << " " << c;
          if (!(tr == 0 && tc == 0)) {
            ASSERT_LE(std::fabs(q[i] - w[i]), std::fabs(w[i]) * 0x1p-4) << r << " " << c;
          }
        }
      }
    }
  }
  // Zero tile -> scale 1, values stay zero.
  std::vector<float> zeros(130 * 5, 0.0f);
  std::vector<float> zero_scales(2);
  quantize_dequantize_tile_blocks(zeros.data(), 130, 5, Fp8Format::E4M3, 128, zero_scales.data());
  EXPECT_EQ(zero_scales[0], 1.0f);
  EXPECT_EQ(zero_scales[1], 1.0f);
  for (float v : zeros) EXPECT_EQ(v, 0.0f);
}

// Large enough for the OpenMP paths: the result does not depend on how work is split.
TEST(Fp8Scaling, BlockwiseLargeMatchesSerialDefinition) {
  const int64_t rows = 257, cols = 1000;
  auto x = normal_values(rows * cols, 13);
  auto rowwise = x, tiles = x;
  quantize_dequantize_rowwise_blocks(rowwise.data(), rows, cols, Fp8Format::E5M2);
  quantize_dequantize_tile_blocks(tiles.data(), rows, cols, Fp8Format::E5M2);
  for (int64_t r = 0; r < rows; r += 37) {
    for (int64_t b = 0; b * 128 < cols; ++b) {
      const int64_t begin = r * cols + b * 128, n = std::min<int64_t>(128, cols - b * 128);
      std::vector<float> alone(x.begin() + begin, x.begin() + begin + n);
      const float s = block_scale(amax(alone.data(), n), Fp8Format::E5M2);
      quantize_dequantize_fp8(alone.data(), n, Fp8Format::E5M2, s);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(rowwise[static_cast<size_t>(begin + i)], alone[static_cast<size_t>(i)]);
    }
  }
  EXPECT_NE(tiles, rowwise);  // different blocking, different scales
}

}  // namespace
}  // namespace loom::precision
