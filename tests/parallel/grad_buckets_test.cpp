// Bucket layout: reverse packing, contiguity, sizes, padding, shard ranges, and the mapping of
// flat ranges back to parameter slices.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/parallel/data/grad_buckets.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::ranges;
using testing::total;

// Every bucket is one contiguous range, buckets tile the buffer from the top down, every
// parameter is in exactly one bucket, and the shards tile each bucket in rank order.
void expect_consistent(const BucketLayout& layout, const std::vector<ParamRange>& params) {
  int64_t top = total(params);
  std::vector<int> seen(params.size(), 0);
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const Bucket& bucket = layout.buckets[b];
    EXPECT_EQ(bucket.offset + bucket.numel, top) << "bucket " << b;
    top = bucket.offset;
    int64_t sum = 0;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const int p = bucket.params[i];
      ++seen[p];
      EXPECT_EQ(layout.bucket_of[p], static_cast<int>(b));
      if (i > 0) {
        EXPECT_EQ(p, bucket.params[i - 1] - 1) << "reverse registration order";
      }
      sum += params[p].numel;
    }
    EXPECT_EQ(sum, bucket.numel);
    EXPECT_EQ(bucket.padded_numel % layout.shard_ranks, 0);
    EXPECT_GE(bucket.padded_numel, bucket.numel);
    EXPECT_LT(bucket.padded_numel - bucket.numel, layout.shard_ranks);
    EXPECT_EQ(bucket.shard_numel * layout.shard_ranks, bucket.padded_numel);
    ASSERT_EQ(static_cast<int>(bucket.shards.size()), layout.shard_ranks);
    int64_t at = bucket.offset;
    for (int r = 0; r < layout.shard_ranks; ++r) {
      const FlatRange s = bucket.shards[r];
      EXPECT_EQ(s.begin, at);
      EXPECT_LE(s.size(), bucket.shard_numel);
      EXPECT_GE(s.size(), 0);
      at = s.end;
    }
    EXPECT_EQ(at, bucket.offset + bucket.numel);
  }
  EXPECT_EQ(top, params.empty() ? 0 : params.front().offset);
  for (size_t p = 0; p < params.size(); ++p) EXPECT_EQ(seen[p], 1) << "parameter " << p;
  int64_t owned = 0;
  for (int r = 0; r < layout.shard_ranks; ++r) owned += layout.owned_numel(r);
  EXPECT_EQ(owned, total(params));
}

TEST(GradBuckets, PacksInReverseOrderUpToTheBucketSize) {
  const auto params = ranges({5, 7, 3, 11, 2});
  const BucketLayout layout = make_buckets(params, 10 * sizeof(float), 3);
  ASSERT_EQ(layout.buckets.size(), 3u);
  EXPECT_EQ(layout.buckets[0].params, (std::vector<int>{4, 3}));  // 2 + 11 >= 10 elements
  EXPECT_EQ(layout.buckets[1].params, (std::vector<int>{2, 1}));  // 3 + 7
  EXPECT_EQ(layout.buckets[2].params, (std::vector<int>{0}));     // the rest, smaller
  EXPECT_EQ(layout.buckets[0].offset, 15);
  EXPECT_EQ(layout.buckets[0].numel, 13);
  EXPECT_EQ(layout.buckets[0].padded_numel, 15);
  EXPECT_EQ(layout.buckets[0].shard_numel, 5);
  EXPECT_EQ(layout.buckets[0].shards[2].begin, 25);
  EXPECT_EQ(layout.buckets[0].shards[2].end, 28);  // clipped: 3 real elements of 5
  EXPECT_EQ(layout.buckets[2].padded_numel, 6);
  EXPECT_EQ(layout.buckets[2].shards[2].size(), 1);
  EXPECT_EQ(layout.numel(), 28);
  EXPECT_EQ(layout.padded_numel(), 15 + 12 + 6);
  expect_consistent(layout, params);
}

TEST(GradBuckets, AwkwardSizesAndRankCounts) {
  const auto params = ranges({1, 257, 0, 13, 1000, 3, 64, 101, 1});
  for (int ranks : {1, 2, 3, 4, 7, 8}) {
    for (int64_t bucket_bytes : {int64_t{1}, int64_t{4}, int64_t{200}, int64_t{1031 * 4}, int64_t{1} << 30}) {
      SCOPED_TRACE("ranks " + std::to_string(ranks) + ", bucket_bytes " + std::to_string(bucket_bytes));
      const BucketLayout layout = make_buckets(params, bucket_bytes, ranks);
      expect_consistent(layout, params);
      for (const Bucket& b : layout.buckets) {
        // Closed as soon as it reached the size: without its last parameter it was smaller.
        if (&b != &layout.buckets.back()) {
          EXPECT_GE(b.numel * 4, bucket_bytes);
          EXPECT_LT((b.numel - params[b.params.back()].numel) * 4, bucket_bytes);
        }
      }
    }
  }
  EXPECT_EQ(make_buckets(params, 4, 1).buckets.size(), 8u);  // one per parameter (the empty one joins the next)
  EXPECT_EQ(make_buckets(params, int64_t{1} << 30, 4).buckets.size(), 1u);
}

TEST(GradBuckets, MoreRanksThanElementsLeavesEmptyShards) {
  const auto params = ranges({1});
  const BucketLayout layout = make_buckets(params, 1024, 4);
  ASSERT_EQ(layout.buckets.size(), 1u);
  EXPECT_EQ(layout.buckets[0].shard_numel, 1);
  EXPECT_EQ(layout.buckets[0].shards[0].size(), 1);
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(layout.buckets[0].shards[r].empty());
  EXPECT_TRUE(make_buckets({}, 1024, 4).buckets.empty());
}

TEST(GradBuckets, RejectsBadInput) {
  EXPECT_THROW(make_buckets(ranges({4, 4}), 0, 2), Error);
  EXPECT_THROW(make_buckets(ranges({4, 4}), 16, 0), Error);
  EXPECT_THROW(make_buckets({{0, 4}, {5, 4}}, 16, 2), Error);  // a gap
  EXPECT_THROW(make_buckets({{0, 4}, {4, -1}}, 16, 2), Error);
}

TEST(GradBuckets, FlatRangesMapToParameterSlices) {
  const auto params = ranges({5, 0, 7, 3});  // flat: [0,5) [5,5) [5,12) [12,15)
  auto s = param_slices(params, {3, 13});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].param, 0);
  EXPECT_EQ(s[0].begin, 3);
  EXPECT_EQ(s[0].end, 5);
  EXPECT_EQ(s[1].param, 2);
  EXPECT_EQ(s[1].begin, 0);
  EXPECT_EQ(s[1].end, 7);
  EXPECT_EQ(s[2].param, 3);
  EXPECT_EQ(s[2].begin, 0);
  EXPECT_EQ(s[2].end, 1);
  s = param_slices(params, {6, 8});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].param, 2);
  EXPECT_EQ(s[0].begin, 1);
  EXPECT_EQ(s[0].end, 3);
  EXPECT_TRUE(param_slices(params, {4, 4}).empty());
  EXPECT_EQ(param_slices(params, {0, 15}).size(), 3u);
}

TEST(GradBuckets, OverlapStatsFraction) {
  OverlapStats s;
  EXPECT_DOUBLE_EQ(s.hidden_fraction(), 1.0);
  s.add({0.25, 1.0, 1});
  s.add({0.25, 1.0, 1});
  EXPECT_DOUBLE_EQ(s.hidden_fraction(), 0.75);
  EXPECT_EQ(s.rounds, 2);
}

}  // namespace
}  // namespace loom::parallel
