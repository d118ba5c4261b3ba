#include "loom/data/blend_index.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "loom/core/error.h"

namespace loom::data {
namespace {

const std::vector<std::vector<double>> kWeightSets = {
    {1.0},
    {0.7, 0.3},
    {1, 1, 1},
    {0.25, 0.25, 0.5},
    {5, 3, 1, 1e-3},
    {0.11, 0.07, 0.33, 0.02, 0.19, 0.05, 0.23},
    {1e-6, 1.0},
    {3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {1.0 / 3, 1.0 / 7, 0.5},  // not decimal: scaled to integers, the largest 2^40
};

// The apportionment taken one sample at a time from the start, by the largest W / (2c + 1)
// in real numbers (doubles are exact enough for these small counts; ties to the lowest index
// within a relative 1e-12).
std::vector<BlendIndex::Pick> by_quotients(const std::vector<double>& weights, int64_t n) {
  std::vector<int64_t> counts(weights.size(), 0);
  std::vector<BlendIndex::Pick> picks;
  for (int64_t g = 0; g < n; ++g) {
    size_t best = 0;
    for (size_t i = 1; i < weights.size(); ++i) {
      const double mine = weights[i] / (2.0 * counts[i] + 1), theirs = weights[best] / (2.0 * counts[best] + 1);
      if (mine > theirs * (1 + 1e-12)) best = i;
    }
    picks.push_back({static_cast<int>(best), counts[best]++});
  }
  return picks;
}

// The same one sample at a time, by the index's own step.
std::vector<BlendIndex::Pick> stepped(const BlendIndex& index, int64_t n) {
  std::vector<int64_t> counts(static_cast<size_t>(index.datasets()), 0);
  std::vector<BlendIndex::Pick> picks;
  for (int64_t g = 0; g < n; ++g) {
    const int dataset = index.next(counts);
    picks.push_back({dataset, counts[static_cast<size_t>(dataset)]++});
  }
  return picks;
}

// Weights with a few decimals keep their exact ratios, ties included: the steps are those of
// the quotients in real numbers.
TEST(BlendIndex, DecimalWeightsStepAsTheirRealQuotients) {
  for (const auto& weights : kWeightSets) {
    if (weights.size() == 3 && weights[1] == 1.0 / 7) continue;  // not decimal: no exact ratios to keep
    const std::vector<BlendIndex::Pick> want = by_quotients(weights, 6000), got = stepped(BlendIndex(weights), 6000);
    for (size_t g = 0; g < want.size(); ++g) {
      ASSERT_EQ(got[g].dataset, want[g].dataset) << "sample " << g << " of " << weights.size() << " datasets";
    }
  }
}

TEST(BlendIndex, RandomAccessIsTheStepByStepApportionment) {
  for (const auto& weights : kWeightSets) {
    const BlendIndex index(weights);
    const int64_t n = 6000;
    const std::vector<BlendIndex::Pick> want = stepped(index, n);
    std::vector<int64_t> counts(weights.size(), 0);
    for (int64_t g = 0; g < n; ++g) {
      ASSERT_EQ(index.counts_before(g), counts) << "sample " << g << " of " << weights.size() << " datasets";
      const BlendIndex::Pick got = index.picks(g, 1).at(0);
      ASSERT_EQ(got.dataset, want[g].dataset) << "sample " << g << " of " << weights.size() << " datasets";
      ASSERT_EQ(got.sample, want[g].sample) << "sample " << g;
      ++counts[static_cast<size_t>(want[g].dataset)];
    }
    // A run of samples from anywhere is the same picks.
    for (const int64_t first : {int64_t{0}, int64_t{17}, int64_t{4095}}) {
      const std::vector<BlendIndex::Pick> run = index.picks(first, 700);
      for (size_t r = 0; r < run.size(); ++r) {
        ASSERT_EQ(run[r].dataset, want[first + r].dataset);
        ASSERT_EQ(run[r].sample, want[first + r].sample);
      }
    }
  }
}

// Every dataset's share of any prefix of the run follows its weight to within a sample or two,
// and its samples are 0, 1, 2, ... in order.
TEST(BlendIndex, EveryPrefixHoldsEachDatasetsShare) {
  for (const auto& weights : kWeightSets) {
    const BlendIndex index(weights);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<int64_t> counts(weights.size(), 0);
    double worst = 0;
    const std::vector<BlendIndex::Pick> picks = index.picks(0, 20000);
    for (size_t g = 0; g < picks.size(); ++g) {
      ASSERT_EQ(picks[g].sample, counts[static_cast<size_t>(picks[g].dataset)]);
      ++counts[static_cast<size_t>(picks[g].dataset)];
      for (size_t i = 0; i < weights.size(); ++i) {
        worst = std::max(worst, std::abs(counts[i] - static_cast<double>(g + 1) * weights[i] / total));
      }
    }
    EXPECT_LT(worst, 1.5) << weights.size() << " datasets";
  }
}

// Far into a run (a resumed run, a rank starting late): the counts add up to the samples before,
// follow the weights, and the next sample is the one the counts say.
TEST(BlendIndex, CountsFarIntoARunAreExactAndConsistent) {
  for (const auto& weights : kWeightSets) {
    const BlendIndex index(weights);
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    for (const int64_t g : {int64_t{1} << 33, int64_t{999'999'999'937}, int64_t{1} << 50}) {
      const std::vector<int64_t> before = index.counts_before(g), after = index.counts_before(g + 1);
      EXPECT_EQ(std::accumulate(before.begin(), before.end(), int64_t{0}), g);
      const int next = index.next(before);
      for (size_t i = 0; i < weights.size(); ++i) {
        EXPECT_EQ(after[i] - before[i], static_cast<int64_t>(i) == next ? 1 : 0) << "dataset " << i << " at " << g;
        EXPECT_NEAR(static_cast<double>(before[i]), static_cast<double>(g) * weights[i] / total,
                    2.0 + 1e-12 * static_cast<double>(g))  // the last set's scaling: 2^-40 of the largest
            << "dataset " << i << " at " << g;
      }
      const BlendIndex::Pick pick = index.picks(g, 1).at(0);
      EXPECT_EQ(pick.dataset, next);
      EXPECT_EQ(pick.sample, before[static_cast<size_t>(next)]);
    }
  }
}

TEST(BlendIndex, OneDatasetReadsItsOwnSamplesInOrder) {
  const BlendIndex index({0.4});
  const std::vector<BlendIndex::Pick> picks = index.picks(123456789, 5);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(picks[r].dataset, 0);
    EXPECT_EQ(picks[r].sample, 123456789 + r);
  }
}

TEST(BlendIndex, RefusesWeightsThatAreNotFiniteAndPositive) {
  EXPECT_THROW(BlendIndex(std::vector<double>{}), Error);
  for (const double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW(BlendIndex({1.0, bad}), Error) << bad;
  }
}

}  // namespace
}  // namespace loom::data
