// A GRPO step's rows (rl/rollout_rows.h): packed samples keep every token, target, trained mark,
// advantage and generation log-probability of one sample per row, each in a document of its own
// with positions from 0; the rows the samples fill are first-fit decreasing's, rounded up to the
// batch unit and at most train.global_batch; one sample per row keeps train.global_batch rows;
// samples that do not fit are refused naming train.global_batch; grpo.minibatches splits the
// samples in order, each update's share laid out alone in rows after the previous update's.
#include "loom/rl/rollout_rows.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "loom/core/error.h"

namespace loom::rl {
namespace {

// Group g's sample s: `lengths[g][s]` tokens 100 g + 10 s + k, the first 2 a prompt, rewards
// 0, 1, 2, ... within a group (no zero-variance group).
std::vector<RolloutGroup> groups_of(const std::vector<std::vector<int>>& lengths) {
  std::vector<RolloutGroup> groups;
  for (size_t g = 0; g < lengths.size(); ++g) {
    RolloutGroup group;
    for (size_t s = 0; s < lengths[g].size(); ++s) {
      Rollout r;
      for (int k = 0; k < lengths[g][s]; ++k) {
        r.tokens.push_back(static_cast<int32_t>(100 * g + 10 * s + static_cast<size_t>(k)));
        r.trained.push_back(k >= 2 ? 1 : 0);
        r.generation_logprobs.push_back(k >= 2 ? -0.5f * static_cast<float>(k) : 0.0f);
      }
      r.reward = static_cast<double>(s);
      group.samples.push_back(r);
    }
    groups.push_back(group);
  }
  return groups;
}

config::GrpoConfig packing(bool on, int minibatches = 1) {
  config::GrpoConfig grpo;
  grpo.packing = on;
  grpo.minibatches = minibatches;
  return grpo;
}

// Each sample's slots as (document's first slot, length), read back from a layout's rows: the
// inputs of every document of every row, keyed by its first input token.
struct Document {
  int row, first_slot, length;
};
std::map<int32_t, Document> documents_of(const RolloutRows& rows) {
  std::map<int32_t, Document> out;
  for (int r = 0; r < rows.rows; ++r) {
    const size_t base = static_cast<size_t>(r) * static_cast<size_t>(rows.seq);
    for (int k = 0; k < rows.seq; ++k) {
      const size_t at = base + static_cast<size_t>(k);
      const bool starts = rows.documents.empty() ? k == 0 : rows.positions[at] == 0;
      if (starts && rows.targets[at] != 0) out[rows.inputs[at]] = {r, k, 0};
      if (rows.targets[at] != 0) {
        const size_t start = rows.documents.empty() ? base : at - static_cast<size_t>(rows.positions[at]);
        const int32_t first = rows.inputs[start];
        ++out[first].length;
      }
    }
  }
  return out;
}

// Every sample's run of slots in `got` holds what it holds in `expected` (its inputs, targets,
// marks, advantage, log-probabilities and size), packed ones with positions from 0 in one document.
void expect_same_samples(const RolloutRows& got, const RolloutRows& expected) {
  const std::map<int32_t, Document> in_got = documents_of(got), in_expected = documents_of(expected);
  ASSERT_EQ(in_got.size(), in_expected.size());
  const size_t seq = static_cast<size_t>(got.seq);
  for (const auto& [first, g] : in_got) {
    SCOPED_TRACE("sample starting with token " + std::to_string(first));
    const Document& e = in_expected.at(first);
    ASSERT_EQ(g.length, e.length);
    for (int k = 0; k < e.length; ++k) {
      const size_t a = static_cast<size_t>(e.row) * seq + static_cast<size_t>(e.first_slot + k);
      const size_t b = static_cast<size_t>(g.row) * seq + static_cast<size_t>(g.first_slot + k);
      EXPECT_EQ(got.inputs[b], expected.inputs[a]);
      EXPECT_EQ(got.targets[b], expected.targets[a]);
      EXPECT_EQ(got.weights[b], expected.weights[a]);
      EXPECT_EQ(got.advantages[b], expected.advantages[a]);
      EXPECT_EQ(got.generation_logprobs[b], expected.generation_logprobs[a]);
      EXPECT_EQ(got.sample_targets[b], expected.sample_targets[a]);
      if (got.documents.empty()) continue;
      EXPECT_EQ(got.positions[b], k);
      EXPECT_EQ(got.documents[b], got.documents[b - static_cast<size_t>(k)]);
    }
  }
}

TEST(RolloutRows, PackedSamplesKeepTheirTokensInDocumentsOfTheirOwn) {
  // 2 groups of 3: 13, 9, 6 and 7, 4, 12 tokens (12, 8, 5, 6, 3, 11 slots) in rows of 16.
  const std::vector<RolloutGroup> groups = groups_of({{13, 9, 6}, {7, 4, 12}});
  const RolloutRows padded = make_rollout_rows(groups, packing(false), 8, 16, 2);
  const RolloutRows packed = make_rollout_rows(groups, packing(true), 8, 16, 2);
  EXPECT_EQ(padded.rows, 8);  // train.global_batch rows
  EXPECT_EQ(padded.filled_rows, 6);
  EXPECT_TRUE(padded.documents.empty() && padded.positions.empty());
  // First-fit decreasing: 12+3, 11+5, 8+6 -> 3 rows, rounded up to the unit of 2: 4.
  EXPECT_EQ(packed.filled_rows, 3);
  EXPECT_EQ(packed.rows, 4);
  EXPECT_DOUBLE_EQ(packed.packing_efficiency, 45.0 / 64.0);
  EXPECT_DOUBLE_EQ(padded.packing_efficiency, 45.0 / 128.0);
  for (const RolloutRows* rows : {&padded, &packed}) {
    EXPECT_EQ(rows->samples, 6);
    ASSERT_EQ(rows->minibatches.size(), 1u);
    EXPECT_EQ(rows->minibatches[0].trained_samples, 6);
    EXPECT_EQ(rows->minibatches[0].trained_targets, 45 - 6);  // every sample's slots but its prompt's second token
    EXPECT_EQ(rows->zero_variance_groups, 0);
  }
  // Every sample's run of slots holds its inputs, targets, marks, advantage and log-probabilities,
  // the same in both layouts.
  EXPECT_EQ(documents_of(packed).size(), 6u);
  expect_same_samples(packed, padded);
  // Documents are numbered from 0 along each row, the padding after the samples one of its own
  // with positions from 0; the fourth row is padding alone.
  for (int r = 0; r < packed.rows; ++r) {
    const size_t base = static_cast<size_t>(r) * 16;
    std::set<int32_t> ids;
    for (size_t k = 0; k < 16; ++k) {
      ids.insert(packed.documents[base + k]);
      if (k > 0 && packed.documents[base + k] == packed.documents[base + k - 1]) {
        EXPECT_EQ(packed.positions[base + k], packed.positions[base + k - 1] + 1);
      } else {
        EXPECT_EQ(packed.positions[base + k], 0);
        EXPECT_EQ(packed.documents[base + k], k == 0 ? 0 : packed.documents[base + k - 1] + 1);
      }
    }
    const size_t expected[] = {3, 2, 3, 1};  // two samples and the padding (the second row is full)
    EXPECT_EQ(ids.size(), expected[r]) << "row " << r;
  }
}

TEST(RolloutRows, APackedStepTakesAtLeastOneUnitAndAtMostTheGlobalBatch) {
  const std::vector<RolloutGroup> groups = groups_of({{9, 9, 9, 9}});  // 8 slots each: 2 rows of 16
  EXPECT_EQ(make_rollout_rows(groups, packing(true), 8, 16, 1).rows, 2);
  EXPECT_EQ(make_rollout_rows(groups, packing(true), 8, 16, 4).rows, 4);
  EXPECT_EQ(make_rollout_rows(groups, packing(true), 3, 16, 4).rows, 3);  // the rounding capped
  EXPECT_EQ(make_rollout_rows(groups, packing(true), 2, 16, 1).rows, 2);  // 4 samples in 2 rows
  try {
    make_rollout_rows(groups, packing(false), 2, 16, 1);
    ADD_FAILURE() << "4 samples taken into 2 rows one per row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.global_batch = 2"), std::string::npos) << e.what();
  }
  try {
    make_rollout_rows(groups_of({{9, 9, 9, 9, 9}}), packing(true), 2, 16, 1);
    ADD_FAILURE() << "5 samples of 8 slots packed into 2 rows of 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("packed fill 3 rows of data.seq_len 16 but train.global_batch = 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(RolloutRows, ASampleTooLongForARowIsNamed) {
  try {
    make_rollout_rows(groups_of({{9, 18}}), packing(true), 4, 16, 1);
    ADD_FAILURE() << "an 18-token sample in rows of 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollout group 0 sample 1 has 18 tokens"), std::string::npos) << e.what();
  }
}

// Two updates: group 0's samples (12, 8, 5 slots) then group 1's (6, 3, 11), each packed alone
// (12 | 8 + 5 and 11 + 3 | 6), every sample's slots as one update holds them (advantages from its
// whole group); the shares' sizes differ by at most one; more updates than samples are refused.
TEST(RolloutRows, MinibatchesSplitTheSamplesInOrderEachLaidOutAlone) {
  const std::vector<RolloutGroup> groups = groups_of({{13, 9, 6}, {7, 4, 12}});
  const RolloutRows whole = make_rollout_rows(groups, packing(true), 8, 16, 2);
  const RolloutRows split = make_rollout_rows(groups, packing(true, 2), 8, 16, 2);
  ASSERT_EQ(split.minibatches.size(), 2u);
  ASSERT_EQ(whole.minibatches.size(), 1u);
  EXPECT_EQ(whole.minibatches[0].rows, whole.rows);
  EXPECT_EQ(split.rows, 4);
  EXPECT_EQ(split.filled_rows, 4);
  EXPECT_EQ(split.minibatches[0].rows, 2);
  EXPECT_EQ(split.minibatches[1].rows, 2);
  EXPECT_EQ(split.minibatches[0].trained_targets, 11 + 7 + 4);  // each sample's slots but its first target
  EXPECT_EQ(split.minibatches[1].trained_targets, 5 + 2 + 10);
  EXPECT_EQ(split.minibatches[0].trained_samples, 3);
  EXPECT_EQ(split.minibatches[1].trained_samples, 3);
  EXPECT_EQ(split.minibatches[0].trained_targets + split.minibatches[1].trained_targets,
            whole.minibatches[0].trained_targets);
  EXPECT_EQ(split.minibatches[0].trained_samples + split.minibatches[1].trained_samples,
            whole.minibatches[0].trained_samples);
  EXPECT_EQ(split.samples, 6);
  EXPECT_DOUBLE_EQ(split.packing_efficiency, 45.0 / 64.0);
  EXPECT_EQ(documents_of(split).size(), 6u);
  expect_same_samples(split, whole);
  for (const auto& [first, d] : documents_of(split)) {
    EXPECT_EQ(d.row < 2, first < 100) << first;  // group 0's samples in the first update's rows
  }
  // One per row: each update takes train.global_batch rows.
  const RolloutRows padded = make_rollout_rows(groups, packing(false, 2), 4, 16, 2);
  EXPECT_EQ(padded.rows, 8);
  EXPECT_EQ(padded.minibatches[1].rows, 4);
  // Six samples in four updates: 1, 2, 1 and 2 of them.
  const RolloutRows four = make_rollout_rows(groups, packing(false, 4), 2, 16, 1);
  ASSERT_EQ(four.minibatches.size(), 4u);
  const int64_t samples[] = {1, 2, 1, 2};
  for (size_t m = 0; m < 4; ++m) EXPECT_EQ(four.minibatches[m].trained_samples, samples[m]) << "update " << m;
  try {
    make_rollout_rows(groups, packing(true, 7), 8, 16, 2);
    ADD_FAILURE() << "7 updates of 6 samples";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grpo.minibatches = 7"), std::string::npos) << e.what();
  }
  try {
    make_rollout_rows(groups, packing(false, 2), 2, 16, 1);
    ADD_FAILURE() << "3 samples of an update taken into 2 rows one per row";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("an update's (of grpo.minibatches = 2) 3 samples need as many rows but "
                                         "train.global_batch = 2"),
              std::string::npos)
        << e.what();
  }
}

// grpo.epochs: the source serves the step's rows pass after pass, and nothing past the last pass.
TEST(RolloutRows, TheSourceServesItsRowsPassAfterPass) {
  RolloutSource source;
  const RolloutRows rows = make_rollout_rows(groups_of({{13, 9, 6}, {7, 4, 12}}), packing(true), 8, 16, 2);
  source.set(rows, 100, 2);
  train::TokenBatch first, again;
  first.resize(2, 16);
  again.resize(2, 16);
  source.fill(102, first);
  source.fill(102 + rows.rows, again);
  EXPECT_EQ(again.inputs, first.inputs);
  EXPECT_EQ(again.documents, first.documents);
  EXPECT_EQ(again.advantages, first.advantages);
  try {
    source.fill(100 + 2 * rows.rows, again);
    ADD_FAILURE() << "a third pass was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("(2 passes over 4 rows)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::rl
