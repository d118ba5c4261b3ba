// Speculative decoding's verification rule (speculative.h): a draft drawn from q, kept with
// probability min(1, p/q), else a token from the residual, gives tokens distributed as p alone;
// under greedy sampling it keeps exactly the target's argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "loom/core/philox.h"
#include "loom/infer/speculative.h"

namespace loom::infer {
namespace {

TEST(SpeculativeVerification, EmittedTokensFollowTheTargetDistribution) {
  // The target keeps the top 4 of 6 ids; the draft all 6, ordered otherwise and hotter.
  const std::vector<float> target_logits = {2.0f, 0.5f, 1.5f, -1.0f, 0.0f, -3.0f};
  const std::vector<float> draft_logits = {0.2f, 1.8f, 1.0f, 0.9f, -0.5f, 0.4f};
  const model::TokenDistribution p =
      model::token_distribution(target_logits.data(), 6, {.temperature = 1.0, .top_k = 4});
  const model::TokenDistribution q = model::token_distribution(draft_logits.data(), 6, {.temperature = 1.3});
  const uint64_t key = philox_key(3, "speculative-test");
  const int trials = 200000;
  std::vector<double> counts(6, 0.0);
  double kept = 0.0;
  for (int i = 0; i < trials; ++i) {
    const int32_t draft = model::draw_token(q, philox_uniform(key, i, kDraftStream));
    const bool accepted = accept_draft(p, q, draft, philox_uniform(key, i, kAcceptStream));
    const int32_t token = accepted ? draft : residual_token(p, q, philox_uniform(key, i));
    counts[static_cast<size_t>(token)] += 1.0;
    kept += accepted ? 1.0 : 0.0;
  }
  double overlap = 0.0;  // the chance a draft is kept: sum of min(p, q)
  for (int32_t id = 0; id < 6; ++id) {
    const double expected = p.probability(id);
    const double sigma = std::sqrt(expected * (1.0 - expected) / trials);
    EXPECT_NEAR(counts[static_cast<size_t>(id)] / trials, expected, 5.0 * sigma + 1e-12) << "id " << id;
    overlap += std::min(p.probability(id), q.probability(id));
  }
  EXPECT_EQ(counts[3], 0.0);  // outside the target's top 4: never emitted
  EXPECT_EQ(counts[5], 0.0);
  EXPECT_NEAR(kept / trials, overlap, 0.005);
  // The draft's distribution itself is another one: the check above can fail.
  EXPECT_GT(std::abs(q.probability(1) - p.probability(1)), 0.1);
}

TEST(SpeculativeVerification, GreedyKeepsTheArgmaxAndReplacesAnythingElseByIt) {
  const std::vector<float> logits = {0.1f, 3.0f, 2.9f};
  const model::TokenDistribution p = model::token_distribution(logits.data(), 3, {.temperature = 0.0});
  const std::vector<float> other = {5.0f, 0.0f, 0.0f};
  const model::TokenDistribution q_right = p;
  const model::TokenDistribution q_wrong = model::token_distribution(other.data(), 3, {.temperature = 0.0});
  for (double u : {0.0, 0.5, 0.999}) {
    EXPECT_TRUE(accept_draft(p, q_right, 1, u));
    EXPECT_FALSE(accept_draft(p, q_wrong, 0, u));
    EXPECT_EQ(residual_token(p, q_wrong, u), 1);
  }
  // A draft its own distribution gives no mass is refused, never divided by zero.
  EXPECT_FALSE(accept_draft(p, q_wrong, 2, 0.0));
}

}  // namespace
}  // namespace loom::infer
