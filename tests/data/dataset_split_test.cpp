#include "loom/data/dataset_split.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "loom/core/error.h"

namespace loom::data {
namespace {

struct Case {
  std::vector<double> shares;
  int64_t count;
  std::array<int64_t, 4> megatron;  // Megatron-Core's _get_split_indices(parse_and_normalize_split(...), count)
};

// The expected bounds were printed by Megatron-Core's two functions (transcribed to Python, run on
// these arguments); halves round to even there (Python's round), as "1,1" of 5 and "1,1,2" of 6 show.
TEST(DatasetSplit, BoundsAreMegatronsOnAwkwardCounts) {
  const std::vector<Case> cases = {
      {{969, 30, 1}, 1000, {0, 969, 999, 1000}},     {{969, 30, 1}, 10, {0, 10, 10, 10}},
      {{969, 30, 1}, 123457, {0, 119630, 123334, 123457}}, {{90, 9, 1}, 1000, {0, 900, 990, 1000}},
      {{1}, 7, {0, 7, 7, 7}},                        {{2, 1}, 7, {0, 5, 7, 7}},
      {{1, 1, 1}, 10, {0, 4, 7, 10}},                {{1, 1}, 5, {0, 3, 5, 5}},
      {{1, 1, 2}, 6, {0, 1, 3, 6}},                  {{1, 2, 1}, 2, {0, 1, 2, 2}},
      {{0.5, 0.25, 0.25}, 3, {0, 1, 2, 3}},          {{98, 1, 1}, 50, {0, 50, 50, 50}},
      {{6, 3, 1}, 1, {0, 1, 1, 1}},                  {{1, 1, 1}, 2, {0, 0, 1, 2}},
      {{100, 0, 0}, 9, {0, 9, 9, 9}},                {{70, 20, 10}, 333, {0, 233, 300, 333}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(split_text(c.shares) + " of " + std::to_string(c.count));
    EXPECT_EQ(split_bounds(c.shares, c.count), c.megatron);
    for (const SplitPart part : {SplitPart::Train, SplitPart::Validation, SplitPart::Test}) {
      const auto i = static_cast<size_t>(part);
      const SequenceRange range = split_range(c.shares, part, c.count);
      EXPECT_EQ(range.begin, c.megatron[i]);
      EXPECT_EQ(range.end, c.megatron[i + 1]);
    }
  }
}

TEST(DatasetSplit, SharesAreNormalisedAndPadded) {
  const std::array<double, 3> halves = normalized_split({2, 2});
  EXPECT_EQ(halves, (std::array<double, 3>{0.5, 0.5, 0.0}));
  EXPECT_EQ(split_text({969, 30, 1}), "969,30,1");
  EXPECT_EQ(split_text({0.9, 0.05, 0.05}), "0.9,0.05,0.05");
  EXPECT_STREQ(split_part_name(SplitPart::Validation), "validation");
}

TEST(DatasetSplit, BadSharesAreErrors) {
  for (const std::vector<double>& bad :
       std::vector<std::vector<double>>{{}, {1, 1, 1, 1}, {1, -1}, {0, 0, 0}, {1, std::nan("")}}) {
    SCOPED_TRACE(split_text(bad));
    EXPECT_THROW(normalized_split(bad), Error);
  }
  try {
    normalized_split({1, -1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1,-1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::data
