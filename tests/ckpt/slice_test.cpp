#include "loom/ckpt/slice.h"

#include <gtest/gtest.h>

#include <numeric>

#include "loom/core/error.h"

namespace loom::ckpt {
namespace {

// Row-major flat index of every element a slice covers, in order.
std::vector<int64_t> flat_indices(const Shape& shape, const Slice& slice) {
  std::vector<int64_t> global(static_cast<size_t>(shape_numel(shape)));
  std::iota(global.begin(), global.end(), 0);
  std::vector<int64_t> out(static_cast<size_t>(slice_numel(slice)));
  copy_region(global.data(), full_slice(shape), out.data(), slice, slice, sizeof(int64_t));
  return out;
}

TEST(Slice, FlatRangesSplitIntoRectanglesInOrder) {
  for (const Shape& shape : std::vector<Shape>{{}, {1}, {7}, {3, 5}, {2, 3, 4}, {3, 1, 5, 2}, {0, 3}}) {
    int64_t n = shape_numel(shape);
    for (int64_t begin = 0; begin <= n; ++begin) {
      for (int64_t count = 0; begin + count <= n; ++count) {
        std::vector<Slice> slices = flat_range_slices(shape, begin, count);
        EXPECT_LE(slices.size(), std::max<size_t>(1, 2 * shape.size()));
        std::vector<int64_t> got;
        for (const Slice& s : slices) {
          check_slice(s, shape, "test");
          EXPECT_GT(slice_numel(s), 0);
          for (int64_t i : flat_indices(shape, s)) got.push_back(i);
        }
        std::vector<int64_t> want(static_cast<size_t>(count));
        std::iota(want.begin(), want.end(), begin);
        EXPECT_EQ(got, want) << shape_string(shape) << " begin " << begin << " count " << count;
      }
    }
  }
  EXPECT_THROW(flat_range_slices({3, 4}, 10, 5), Error);
}

TEST(Slice, CopyRegionBetweenOverlappingSlices) {
  const Shape shape = {4, 5, 3};
  Slice a = {{0, 3}, {1, 4}, {0, 3}}, b = {{2, 2}, {0, 5}, {1, 2}}, region;
  ASSERT_TRUE(intersect_slices(a, b, &region));
  EXPECT_EQ(region, (Slice{{2, 1}, {1, 4}, {1, 2}}));
  std::vector<int64_t> src = flat_indices(shape, a), dst(static_cast<size_t>(slice_numel(b)), -1);
  copy_region(src.data(), a, dst.data(), b, region, sizeof(int64_t));
  std::vector<int64_t> want = flat_indices(shape, b);
  for (size_t i = 0; i < dst.size(); ++i) {
    // Elements of b outside a stay untouched.
    int64_t flat = want[i], d0 = flat / 15, d1 = flat / 3 % 5, d2 = flat % 3;
    bool inside = d0 == 2 && d1 >= 1 && d2 >= 1;
    EXPECT_EQ(dst[i], inside ? flat : -1) << i;
  }
  EXPECT_FALSE(slices_overlap({{0, 2}}, {{2, 2}}));
  EXPECT_FALSE(slices_overlap({{0, 0}}, {{0, 2}}));
  EXPECT_THROW(check_slice({{0, 2}}, {2, 2}, "t"), Error);
  EXPECT_THROW(check_slice({{1, 2}}, {2}, "t"), Error);
  EXPECT_THROW(check_slice({{-1, 1}}, {2}, "t"), Error);
}

}  // namespace
}  // namespace loom::ckpt
