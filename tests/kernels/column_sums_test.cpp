// The bias gradient's column sums (kernels/column_sums.h): the order every device follows, the
// CPU kernel against a serial reference in that order bit for bit, and against fp64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/kernels/column_sums.h"
#include "loom/kernels/cpu/linear.h"

namespace loom::kernels {
namespace {

TEST(ColumnSums, ChunksAreMultiplesOf64RowsAndAtMost1024OfThem) {
  EXPECT_EQ(column_sum_chunk(0), 64);
  EXPECT_EQ(column_sum_chunk(1), 64);
  EXPECT_EQ(column_sum_chunk(64 * 1024), 64);
  EXPECT_EQ(column_sum_chunk(64 * 1024 + 1), 128);
  EXPECT_EQ(column_sum_chunk(1 << 20), 1024);
  for (int64_t rows : {1, 100, 65536, 65537, 1000000, 123456789}) {
    const int64_t chunk = column_sum_chunk(rows);
    EXPECT_EQ(chunk % 64, 0) << rows;
    EXPECT_LE((rows + chunk - 1) / chunk, kColumnSumChunks) << rows;
  }
}

TEST(ColumnSums, TheCpuKernelFollowsTheChunkedOrderBitForBit) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 3}, {63, 5}, {64, 7}, {65, 130}, {1000, 33}, {2049, 9},
                            {64 * 1024 + 5, 3}}) {
    std::vector<float> x(static_cast<size_t>(rows * cols)), start(static_cast<size_t>(cols));
    for (float& v : x) v = normal(rng);
    for (float& v : start) v = normal(rng);
    // The order written out: chunks summed in row order from zero, groups of 32 chunk sums from
    // zero, the groups' sums added in order to the start.
    const int64_t chunk = column_sum_chunk(rows), group_rows = chunk * kColumnSumChunksPerGroup;
    std::vector<float> expected = start;
    std::vector<double> exact(start.begin(), start.end());
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t group_first = 0; group_first < rows; group_first += group_rows) {
        float group = 0.0f;
        for (int64_t first = group_first; first < std::min(rows, group_first + group_rows); first += chunk) {
          float partial = 0.0f;
          for (int64_t r = first; r < std::min(rows, first + chunk); ++r) {
            partial += x[static_cast<size_t>(r * cols + c)];
            exact[static_cast<size_t>(c)] += x[static_cast<size_t>(r * cols + c)];
          }
          group += partial;
        }
        expected[static_cast<size_t>(c)] += group;
      }
    }
    std::vector<float> sums = start;
    cpu::add_column_sums(sums.data(), x.data(), rows, cols);
    EXPECT_EQ(sums, expected) << rows << " x " << cols;
    std::vector<float> through_linear = start;
    cpu::linear_backward(nullptr, nullptr, through_linear.data(), x.data(), nullptr, nullptr, rows, 1, cols);
    EXPECT_EQ(through_linear, expected) << rows << " x " << cols;
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_NEAR(sums[static_cast<size_t>(c)], exact[static_cast<size_t>(c)], 1e-5 * std::sqrt(double(rows)) + 1e-5)
          << rows << " x " << cols << " column " << c;
    }
  }
}

}  // namespace
}  // namespace loom::kernels
