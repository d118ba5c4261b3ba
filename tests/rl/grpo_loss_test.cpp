// The GRPO loss against values computed by hand: leave-one-out advantages with and without the
// std division, zero-variance groups, the ratio clipped on each side, the dual clip, tis and
// icepop weights, the k3 KL, masks and the global token mean, DAPO's overlong shaping and
// filtering, GSPO's ratios and weights per sample; and every token gradient against central finite
// differences (GSPO's of the whole loss, through its samples' shared ratios).
#include "loom/rl/grpo_loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::rl {
namespace {

LossOptions no_kl() {
  LossOptions o;
  o.kl_coeff = 0.0;
  return o;
}

// A token whose ratio is `ratio` (logp - old = log ratio) and whose generation log-prob equals old.
TokenLoss at_ratio(const LossOptions& o, double ratio, double advantage, LossStatistics& stats) {
  const double old = -1.0;
  return token_loss(o, old + std::log(ratio), old, old, 0.0, advantage, stats);
}

AdvantageOptions advantage_options(bool leave_one_out, bool normalize_std, double epsilon) {
  return {leave_one_out, normalize_std, epsilon};
}

TEST(GroupAdvantages, LeaveOneOutBaselineWithoutNormalisation) {
  const GroupAdvantages a = group_advantages({1.0, 0.0, 0.0, 0.0}, advantage_options(true, false, 0.0));
  EXPECT_FALSE(a.zero_variance);
  EXPECT_DOUBLE_EQ(a.advantages[0], 1.0);           // 1 - mean(0, 0, 0)
  EXPECT_DOUBLE_EQ(a.advantages[1], -1.0 / 3.0);    // 0 - mean(1, 0, 0)
  EXPECT_DOUBLE_EQ(a.advantages[3], -1.0 / 3.0);
}

TEST(GroupAdvantages, DividedByTheOtherSamplesStd) {
  // Sample 1's others are {1, 0, 0}: mean 1/3, Bessel-corrected std sqrt((1/3 - 1/9) 3/2) =
  // 1/sqrt(3), so A = (-1/3) sqrt(3) = -1/sqrt(3). Sample 0's others are all 0 (std 0): A stays 1.
  const GroupAdvantages a = group_advantages({1.0, 0.0, 0.0, 0.0}, advantage_options(true, true, 0.0));
  EXPECT_DOUBLE_EQ(a.advantages[0], 1.0);
  EXPECT_NEAR(a.advantages[1], -1.0 / std::sqrt(3.0), 1e-15);
  const GroupAdvantages e = group_advantages({1.0, 0.0, 0.0, 0.0}, advantage_options(true, true, 0.1));
  EXPECT_NEAR(e.advantages[2], (-1.0 / 3.0) / (1.0 / std::sqrt(3.0) + 0.1), 1e-15);
  // Two samples: each has one other (no std of one reward), so the advantages are the plain differences.
  const GroupAdvantages two = group_advantages({1.0, 3.0}, advantage_options(true, true, 1e-6));
  EXPECT_DOUBLE_EQ(two.advantages[0], -2.0);
  EXPECT_DOUBLE_EQ(two.advantages[1], 2.0);
}

// grpo.leave_one_out false: the group's mean and Bessel-corrected std, the sample's own reward in
// both: {1, 0, 0, 0} has mean 1/4 and std sqrt((1/4 - 1/16) 4/3) = 1/2, so A = 3/2 and -1/2.
TEST(GroupAdvantages, TheGroupsMeanAndStdWithoutLeavingOneOut) {
  const GroupAdvantages plain = group_advantages({1.0, 0.0, 0.0, 0.0}, advantage_options(false, false, 0.0));
  EXPECT_DOUBLE_EQ(plain.advantages[0], 0.75);
  EXPECT_DOUBLE_EQ(plain.advantages[1], -0.25);
  const GroupAdvantages a = group_advantages({1.0, 0.0, 0.0, 0.0}, advantage_options(false, true, 0.0));
  EXPECT_NEAR(a.advantages[0], 1.5, 1e-15);
  EXPECT_NEAR(a.advantages[3], -0.5, 1e-15);
  const GroupAdvantages two = group_advantages({1.0, 3.0}, advantage_options(false, true, 0.0));
  EXPECT_NEAR(two.advantages[0], -1.0 / std::sqrt(2.0), 1e-15);  // mean 2, std sqrt(1 x 2)
  const config::RunConfig c = config::parse_config("grpo: {leave_one_out: false, std_epsilon: 0.5}\n", "grpo", {});
  const AdvantageOptions o = AdvantageOptions::from_config(c.grpo);
  EXPECT_FALSE(o.leave_one_out);
  EXPECT_TRUE(o.normalize_std);
  EXPECT_EQ(o.std_epsilon, 0.5);
}

// Random groups of 2 to 9 rewards against a two-pass reference (the baseline's mean, then the
// squared deviations from it over m - 1), both baselines, with and without the std.
TEST(GroupAdvantages, EqualATwoPassReferenceOnRandomGroups) {
  for (int g = 0; g < 200; ++g) {
    const int n = 2 + static_cast<int>(philox4x32(21, g, 0)[0] % 8);
    std::vector<double> rewards;
    for (int i = 0; i < n; ++i) rewards.push_back(static_cast<double>(philox4x32(21, g, i + 1)[0] % 5) * 0.5);
    for (const bool leave_one_out : {true, false}) {
      for (const bool normalize : {true, false}) {
        const GroupAdvantages a = group_advantages(rewards, advantage_options(leave_one_out, normalize, 1e-6));
        bool all_equal = true;
        for (double r : rewards) all_equal = all_equal && r == rewards[0];
        ASSERT_EQ(a.zero_variance, all_equal);
        for (int i = 0; i < n; ++i) {
          std::vector<double> baseline;
          for (int j = 0; j < n; ++j) {
            if (!leave_one_out || j != i) baseline.push_back(rewards[static_cast<size_t>(j)]);
          }
          double mean = 0.0;
          for (double r : baseline) mean += r / static_cast<double>(baseline.size());
          double squares = 0.0;
          for (double r : baseline) squares += (r - mean) * (r - mean);
          const double std = baseline.size() > 1 ? std::sqrt(squares / static_cast<double>(baseline.size() - 1)) : 0.0;
          double expected = all_equal ? 0.0 : rewards[static_cast<size_t>(i)] - mean;
          if (normalize && std > 1e-12 && !all_equal) expected /= std + 1e-6;
          EXPECT_NEAR(a.advantages[static_cast<size_t>(i)], expected, 1e-12) << "group " << g << " sample " << i;
        }
      }
    }
  }
}

TEST(GroupAdvantages, ZeroVarianceGroupsContributeNothing) {
  for (const std::vector<double>& rewards : {std::vector<double>{0.7, 0.7, 0.7}, std::vector<double>{1.0}}) {
    const GroupAdvantages a = group_advantages(rewards, advantage_options(true, true, 1e-6));
    EXPECT_TRUE(a.zero_variance);
    for (double v : a.advantages) EXPECT_EQ(v, 0.0);
  }
}

TEST(GrpoTokenLoss, OnPolicyTokenIsMinusTheAdvantage) {
  LossStatistics s;
  const TokenLoss t = at_ratio(no_kl(), 1.0, 0.5, s);
  EXPECT_DOUBLE_EQ(t.loss, -0.5);
  EXPECT_DOUBLE_EQ(t.gradient, -0.5);
  EXPECT_EQ(s.tokens, 1);
  EXPECT_EQ(s.clipped_low + s.clipped_high + s.dual_clipped, 0);
}

TEST(GrpoTokenLoss, ClipsOnBothSidesOnlyInThePessimisticDirection) {
  const LossOptions o = no_kl();
  LossStatistics s;
  TokenLoss t = at_ratio(o, 1.5, 1.0, s);  // A > 0, r above 1.2: -A * 1.2, no gradient
  EXPECT_NEAR(t.loss, -1.2, 1e-12);
  EXPECT_EQ(t.gradient, 0.0);
  EXPECT_EQ(s.clipped_high, 1);
  t = at_ratio(o, 0.5, -1.0, s);  // A < 0, r below 0.8: -A * 0.8, no gradient
  EXPECT_NEAR(t.loss, 0.8, 1e-12);
  EXPECT_EQ(t.gradient, 0.0);
  EXPECT_EQ(s.clipped_low, 1);
  t = at_ratio(o, 1.5, -1.0, s);  // A < 0, r above 1.2: the unclipped term is larger and kept
  EXPECT_NEAR(t.loss, 1.5, 1e-12);
  EXPECT_NEAR(t.gradient, 1.5, 1e-12);
  t = at_ratio(o, 0.5, 1.0, s);  // A > 0, r below 0.8: kept
  EXPECT_NEAR(t.loss, -0.5, 1e-12);
  EXPECT_NEAR(t.gradient, -0.5, 1e-12);
  EXPECT_EQ(s.clipped_low, 1);
  EXPECT_EQ(s.clipped_high, 1);
  EXPECT_EQ(s.tokens, 4);
  EXPECT_DOUBLE_EQ(s.clip_high_fraction(), 0.25);
}

TEST(GrpoTokenLoss, SeparateLowAndHighClips) {
  LossOptions o = no_kl();
  o.clip_low = 0.1;
  o.clip_high = 0.3;
  LossStatistics s;
  EXPECT_NEAR(at_ratio(o, 1.25, 1.0, s).loss, -1.25, 1e-12);  // inside 1.3
  EXPECT_NEAR(at_ratio(o, 1.35, 1.0, s).loss, -1.3, 1e-12);
  EXPECT_NEAR(at_ratio(o, 0.85, -1.0, s).loss, 0.9, 1e-12);   // below 0.9
  EXPECT_NEAR(at_ratio(o, 0.95, -1.0, s).loss, 0.95, 1e-12);
  EXPECT_EQ(s.clipped_high, 1);
  EXPECT_EQ(s.clipped_low, 1);
}

TEST(GrpoTokenLoss, DualClipBoundsNegativeAdvantages) {
  LossOptions o = no_kl();
  o.dual_clip = 3.0;
  LossStatistics s;
  TokenLoss t = at_ratio(o, 4.0, -2.0, s);  // -A r = 8 > -A c = 6
  EXPECT_NEAR(t.loss, 6.0, 1e-12);
  EXPECT_EQ(t.gradient, 0.0);
  EXPECT_EQ(s.dual_clipped, 1);
  t = at_ratio(o, 2.5, -2.0, s);  // 5 < 6: unclipped
  EXPECT_NEAR(t.loss, 5.0, 1e-12);
  EXPECT_NEAR(t.gradient, 5.0, 1e-12);
  t = at_ratio(o, 4.0, 2.0, s);  // positive advantages are not dual-clipped: -2 * 1.2
  EXPECT_NEAR(t.loss, -2.4, 1e-12);
  EXPECT_EQ(s.dual_clipped, 1);
}

TEST(GrpoTokenLoss, TruncatedImportanceWeights) {
  LossOptions o = no_kl();
  o.correction = config::ImportanceCorrection::Tis;
  o.tis_cap = 2.0;
  LossStatistics s;
  // old - gen = log 3: the weight 3 is truncated to 2; on-policy ratio 1, A = 1.
  TokenLoss t = token_loss(o, -1.0, -1.0, -1.0 - std::log(3.0), 0.0, 1.0, s);
  EXPECT_NEAR(t.loss, -2.0, 1e-12);
  EXPECT_NEAR(t.gradient, -2.0, 1e-12);
  t = token_loss(o, -1.0, -1.0, -1.0 - std::log(0.5), 0.0, 1.0, s);
  EXPECT_NEAR(t.loss, -0.5, 1e-12);
  EXPECT_EQ(s.truncated, 1);
  EXPECT_NEAR(s.weight_mean(), 1.75, 1e-12);  // raw weights 3 and 0.5
  EXPECT_NEAR(s.weight_min, 0.5, 1e-12);
  EXPECT_NEAR(s.weight_max, 3.0, 1e-12);
}

TEST(GrpoTokenLoss, IcepopMasksWeightsOutsideItsBand) {
  LossOptions o = no_kl();
  o.correction = config::ImportanceCorrection::Icepop;
  LossStatistics s;
  for (double raw : {6.0, 0.4}) {
    const TokenLoss t = token_loss(o, -1.0, -1.0, -1.0 - std::log(raw), 0.0, 1.0, s);
    EXPECT_EQ(t.loss, 0.0);
    EXPECT_EQ(t.gradient, 0.0);
  }
  const TokenLoss kept = token_loss(o, -1.0, -1.0, -1.0 - std::log(2.0), 0.0, 1.0, s);
  EXPECT_NEAR(kept.loss, -2.0, 1e-12);
  EXPECT_EQ(s.masked, 2);
  EXPECT_NEAR(s.masked_fraction(), 2.0 / 3.0, 1e-15);
}

TEST(GrpoTokenLoss, K3KlToTheReference) {
  LossOptions o;
  o.kl_coeff = 0.1;
  LossStatistics s;
  // A = 0: only the KL term. ref - logp = -0.5: kl = e^-0.5 + 0.5 - 1.
  const TokenLoss t = token_loss(o, -1.0, -1.0, -1.0, -1.5, 0.0, s);
  const double kl = std::exp(-0.5) + 0.5 - 1.0;
  EXPECT_NEAR(t.loss, 0.1 * kl, 1e-15);
  EXPECT_NEAR(t.gradient, 0.1 * (1.0 - std::exp(-0.5)), 1e-15);
  EXPECT_NEAR(s.kl_mean(), kl, 1e-15);
  // At the reference the KL and its gradient vanish.
  const TokenLoss at_ref = token_loss(o, -2.0, -2.0, -2.0, -2.0, 0.0, s);
  EXPECT_EQ(at_ref.loss, 0.0);
  EXPECT_EQ(at_ref.gradient, 0.0);
}

// grpo.kl_type: k1 -logr (gradient 1), k2 logr^2 / 2 (gradient -logr) at logr = ref - logp =
// -0.5; the input clamp at 0.3 holds logr at -0.3 with no gradient; the output clamp at 0.01
// holds the estimate there with no gradient, and leaves a smaller one alone.
TEST(GrpoTokenLoss, EachKlEstimatorAndClampWithItsGradient) {
  LossOptions o;
  o.kl_coeff = 0.1;
  LossStatistics s;
  auto kl_at = [&](config::KlType type, double input_clamp, double output_clamp) {
    o.kl_type = type;
    o.kl_input_clamp = input_clamp;
    o.kl_output_clamp = output_clamp;
    return token_loss(o, -1.0, -1.0, -1.0, -1.5, 0.0, s);  // A = 0: the KL term alone
  };
  TokenLoss t = kl_at(config::KlType::K1, 0.0, 0.0);
  EXPECT_NEAR(t.loss, 0.1 * 0.5, 1e-15);
  EXPECT_NEAR(t.gradient, 0.1, 1e-15);
  t = kl_at(config::KlType::K2, 0.0, 0.0);
  EXPECT_NEAR(t.loss, 0.1 * 0.125, 1e-15);
  EXPECT_NEAR(t.gradient, 0.1 * 0.5, 1e-15);
  t = kl_at(config::KlType::K3, 0.3, 0.0);
  EXPECT_NEAR(t.loss, 0.1 * (std::exp(-0.3) + 0.3 - 1.0), 1e-15);
  EXPECT_EQ(t.gradient, 0.0);
  t = kl_at(config::KlType::K2, 0.0, 0.01);
  EXPECT_NEAR(t.loss, 0.1 * 0.01, 1e-15);
  EXPECT_EQ(t.gradient, 0.0);
  t = kl_at(config::KlType::K2, 0.0, 0.2);
  EXPECT_NEAR(t.loss, 0.1 * 0.125, 1e-15);
  EXPECT_NEAR(t.gradient, 0.1 * 0.5, 1e-15);
  // k1 is negative where the reference is the likelier (logr = 0.5): clamped from below too.
  o.kl_type = config::KlType::K1;
  const TokenLoss negative = token_loss(o, -1.5, -1.5, -1.5, -1.0, 0.0, s);
  EXPECT_NEAR(negative.loss, 0.1 * -0.2, 1e-15);
  EXPECT_EQ(negative.gradient, 0.0);
  EXPECT_DOUBLE_EQ(kl_estimate(config::KlType::K3, 0.0), 0.0);
  const config::RunConfig c = config::parse_config(
      "grpo: {kl_type: k2, kl_input_clamp: 20, kl_output_clamp: 10}\n", "grpo", {});
  const LossOptions from = LossOptions::from_config(c.grpo);
  EXPECT_EQ(from.kl_type, config::KlType::K2);
  EXPECT_EQ(from.kl_input_clamp, 20.0);
  EXPECT_EQ(from.kl_output_clamp, 10.0);
}

// The mismatch statistics of a token with old -1, gen -1.5 and logp -0.8: exp(0.5); k3 at
// logr 0.5 (the generation policy's KL to the learner's) and at -0.5 (the reverse); half of each
// one's k3 to their mixture; -exp(0.7) x -0.8. k1 gives the KLs -0.5 and 0.5.
TEST(GrpoTokenLoss, MismatchStatisticsOfTheGenerationPolicyAgainstTheLearners) {
  LossOptions o = no_kl();
  LossStatistics s;
  token_loss(o, -0.8, -1.0, -1.5, 0.0, 1.0, s);
  EXPECT_NEAR(s.mult_prob_error_sum, std::exp(0.5), 1e-15);
  EXPECT_NEAR(s.generation_kl_sum, std::exp(0.5) - 1.0 - 0.5, 1e-15);
  EXPECT_NEAR(s.policy_kl_sum, std::exp(-0.5) - 1.0 + 0.5, 1e-15);
  const double p = std::exp(-1.0), q = std::exp(-1.5), m = 0.5 * (p + q);
  const double js = 0.5 * (p / m - 1.0 - std::log(p / m)) + 0.5 * (q / m - 1.0 - std::log(q / m));
  EXPECT_NEAR(s.js_divergence_sum, js, 1e-15);
  EXPECT_NEAR(s.entropy_sum, std::exp(0.7) * 0.8, 1e-14);
  token_loss(o, -1.0, -1.0, -1.0, 0.0, 1.0, s);  // a token where both policies agree adds 1, 0, 0, 0
  EXPECT_NEAR(s.mean(s.mult_prob_error_sum), (std::exp(0.5) + 1.0) / 2.0, 1e-15);
  EXPECT_NEAR(s.mean(s.generation_kl_sum), (std::exp(0.5) - 1.5) / 2.0, 1e-15);
  EXPECT_NEAR(s.mean(s.js_divergence_sum), js / 2.0, 1e-15);
  o.kl_type = config::KlType::K1;
  LossStatistics k1;
  token_loss(o, -0.8, -1.0, -1.5, 0.0, 1.0, k1);
  EXPECT_NEAR(k1.generation_kl_sum, -0.5, 1e-15);
  EXPECT_NEAR(k1.policy_kl_sum, 0.5, 1e-15);
  LossStatistics far;
  token_loss(o, -1.0, -1.0, -2000.0, 0.0, 1.0, far);  // exp(1999): not finite, counts 0
  EXPECT_EQ(far.mult_prob_error_sum, 0.0);
  EXPECT_EQ(far.entropy_sum, 0.0);
}

// grpo.on_policy_kl: the k3 term and its gradient times exp(logp - gen), a constant to the
// gradient (NeMo RL detaches it); the statistics' KL is the weighted one; a non-finite weight is 0.
TEST(GrpoTokenLoss, OnPolicyKlWeightsTheTermByTheCurrentOverTheGenerationPolicy) {
  LossOptions o;
  o.kl_coeff = 0.1;
  o.on_policy_kl = true;
  LossStatistics s;
  // logp -1, gen -1.25: weight e^0.25; ref - logp = -0.5.
  const TokenLoss t = token_loss(o, -1.0, -1.0, -1.25, -1.5, 0.0, s);
  const double weight = std::exp(0.25), kl = std::exp(-0.5) + 0.5 - 1.0;
  EXPECT_NEAR(t.loss, 0.1 * weight * kl, 1e-15);
  EXPECT_NEAR(t.gradient, 0.1 * weight * (1.0 - std::exp(-0.5)), 1e-15);
  EXPECT_NEAR(s.kl_mean(), weight * kl, 1e-15);
  o.on_policy_kl = false;
  LossStatistics plain;
  EXPECT_NEAR(token_loss(o, -1.0, -1.0, -1.25, -1.5, 0.0, plain).loss, 0.1 * kl, 1e-15);
  o.on_policy_kl = true;
  const TokenLoss unbounded = token_loss(o, -1.0, -1.0, -1.0e4, -1.5, 0.0, s);
  EXPECT_EQ(unbounded.loss, 0.0);
  EXPECT_EQ(unbounded.gradient, 0.0);
  const config::RunConfig c = config::parse_config("grpo: {on_policy_kl: true}\n", "grpo", {});
  EXPECT_TRUE(LossOptions::from_config(c.grpo).on_policy_kl);
}

TEST(GrpoLoss, MasksAndTheGlobalTokenMean) {
  // Four tokens, the second not trained; 6 trained tokens in the global batch.
  const std::vector<float> logp = {-1.0f, -2.0f, -0.5f, -3.0f}, advantage = {1.0f, 5.0f, -0.5f, 2.0f};
  const std::vector<uint8_t> trained = {1, 0, 1, 1};
  TokenArrays t{4, logp.data(), logp.data(), logp.data(), nullptr, advantage.data(), trained.data()};
  std::vector<float> loss(4), gradient(4);
  LossStatistics s;
  const double total = grpo_loss(no_kl(), t, 6, loss.data(), gradient.data(), s);
  EXPECT_NEAR(total, (-1.0 + 0.5 - 2.0) / 6.0, 1e-7);
  EXPECT_EQ(loss[1], 0.0f);
  EXPECT_EQ(gradient[1], 0.0f);
  EXPECT_NEAR(gradient[3], -2.0 / 6.0, 1e-7);
  EXPECT_EQ(s.tokens, 3);
}

// Central differences of each token's loss in logp (old, gen and ref fixed), away from the
// clip and clamp boundaries, for every option together, each importance correction with each KL
// estimator.
TEST(GrpoLoss, GradientsMatchFiniteDifferences) {
  LossOptions o;
  o.kl_coeff = 0.05;
  o.dual_clip = 3.0;
  const double clamps[4][2] = {{0.0, 0.0}, {0.3, 0.0}, {0.0, 0.04}, {0.3, 0.2}};  // input, output
  for (int variant = 0; variant < 36; ++variant) {
    o.correction = static_cast<config::ImportanceCorrection>(variant % 3);
    o.kl_type = static_cast<config::KlType>(variant / 3 % 3);
    o.kl_input_clamp = clamps[variant / 9][0];
    o.kl_output_clamp = clamps[variant / 9][1];
    for (int i = 0; i < 200; ++i) {
      auto u = [&](int k) { return (philox4x32(11, i, k)[0] % 100000) / 100000.0; };
      const double old = -0.2 - 3.0 * u(0), logp = old + 2.0 * (u(1) - 0.5);
      const double gen = old + 1.5 * (u(2) - 0.5), ref = old + (u(3) - 0.5), advantage = 4.0 * (u(4) - 0.5);
      const double ratio = std::exp(logp - old);
      const double h = 1e-6;
      auto near = [&](double edge) { return std::fabs(ratio - edge) < 1e-3; };
      if (near(1.0 - o.clip_low) || near(1.0 + o.clip_high) || near(o.dual_clip)) continue;
      const double input = o.kl_input_clamp > 0.0 ? o.kl_input_clamp : 1e9;
      const double logr = std::clamp(ref - logp, -input, input);
      if (std::fabs(std::fabs(ref - logp) - input) < 1e-4) continue;
      if (std::fabs(std::fabs(kl_estimate(o.kl_type, logr)) - o.kl_output_clamp) < 1e-4) continue;
      LossStatistics s;
      const TokenLoss t = token_loss(o, logp, old, gen, ref, advantage, s);
      const double numeric = (token_loss(o, logp + h, old, gen, ref, advantage, s).loss -
                              token_loss(o, logp - h, old, gen, ref, advantage, s).loss) / (2.0 * h);
      EXPECT_NEAR(t.gradient, numeric, 1e-6 * std::max(1.0, std::fabs(numeric))) << "token " << i;
    }
  }
}

LossOptions gspo() {
  LossOptions o;
  o.ratio_level = config::RatioLevel::Sequence;
  o.aggregation = config::LossAggregation::SeqMeanTokenMean;
  return o;
}

// Two samples packed out of order with an untrained token between: each trained token's policy
// term is its sample's w pg(s), s the geometric mean of the sample's token ratios, w its sequence
// likelihood ratio exp(sum(old - gen)) (tis caps it); a clip clips the whole sample.
TEST(GspoLoss, TokensShareTheirSamplesGeometricMeanRatioAndSequenceWeight) {
  LossOptions o = gspo();
  o.kl_coeff = 0.0;
  o.correction = config::ImportanceCorrection::Tis;
  o.tis_cap = 1.3;
  o.clip_low = o.clip_high = 0.1;
  // Sample 0: log ratios 0.08, -0.04 (s = exp(0.02)), old - gen 0.1 and 0.2 (w = exp(0.3), capped);
  // sample 1: log ratios 0.3, 0.08, 0.2 (s = exp(0.58 / 3) > 1.1: clipped high, A > 0), old - gen
  // -0.1 each.
  const std::vector<float> old = {-1.0f, -2.0f, -0.5f, -3.0f, -1.5f, -2.5f};
  const std::vector<float> logp = {-0.92f, -1.7f, -0.54f, -9.0f, -1.42f, -2.3f};
  const std::vector<float> gen = {-1.1f, -1.9f, -0.7f, -3.0f, -1.4f, -2.4f};
  const std::vector<float> advantage = {2.0f, 0.5f, 2.0f, 7.0f, 0.5f, 0.5f};
  const std::vector<uint8_t> trained = {1, 1, 1, 0, 1, 1};
  const std::vector<int32_t> sample = {0, 1, 0, 1, 1, 1};
  TokenArrays t{6, logp.data(), old.data(), gen.data(), nullptr, advantage.data(), trained.data(), sample.data()};
  std::vector<float> loss(6), gradient(6);
  LossStatistics s;
  grpo_loss(o, t, 5, loss.data(), gradient.data(), s);
  const double s0 = std::exp(((-0.92 + 1.0) + (-0.54 + 0.5)) / 2.0), s1 = 1.1;  // s1: the clip
  for (int i : {0, 2}) {
    EXPECT_NEAR(loss[i], 1.3 * -2.0 * s0 / 5.0, 1e-6) << i;
    EXPECT_NEAR(gradient[i], 1.3 * -2.0 * s0 / 5.0, 1e-6) << i;
  }
  const double w1 = std::exp(-0.1 - 0.1 - 0.1);
  for (int i : {1, 4, 5}) {
    EXPECT_NEAR(loss[i], w1 * -0.5 * s1 / 5.0, 1e-6) << i;
    EXPECT_EQ(gradient[i], 0.0f) << i;
  }
  EXPECT_EQ(loss[3], 0.0f);
  EXPECT_EQ(s.tokens, 5);
  EXPECT_EQ(s.clipped_high, 3);  // sample 1's tokens, its clip one for all of them
  EXPECT_EQ(s.truncated, 2);     // sample 0's tokens
  EXPECT_NEAR(s.weight_max, std::exp(0.3), 1e-6);
  EXPECT_NEAR(s.weight_min, w1, 1e-6);
  // Token by token, tokens 0 and 4 (r = exp(0.08) < 1.1) would not clip.
  LossStatistics per_token;
  o.ratio_level = config::RatioLevel::Token;
  grpo_loss(o, t, 5, loss.data(), gradient.data(), per_token);
  EXPECT_EQ(per_token.clipped_high, 2);
}

// seq_mask_tis (band [0.999, 1.002]): sample 0's tokens have old - gen 0.002 and -0.001, a
// geometric-mean weight exp(0.0005) in the band, so each keeps its own weight; sample 1's
// exp(0.005) is out, so both its tokens lose their policy term (and keep their KL).
TEST(SeqMaskTis, KeepsTokenWeightsInSamplesWhoseMeanWeightIsInItsBand) {
  LossOptions o;
  o.kl_coeff = 0.1;
  o.correction = config::ImportanceCorrection::SeqMaskTis;
  const std::vector<float> old = {-1.0f, -2.0f, -0.5f, -3.0f};
  const std::vector<float> logp = {-0.9f, -2.0f, -0.45f, -3.0f};
  const std::vector<float> gen = {-1.002f, -2.004f, -0.499f, -3.006f};
  const std::vector<float> ref = {-1.0f, -2.1f, -0.5f, -3.0f};
  const std::vector<float> advantage = {1.0f, -2.0f, 1.0f, -2.0f};
  const std::vector<uint8_t> trained = {1, 1, 1, 1};
  const std::vector<int32_t> sample = {0, 1, 0, 1};
  TokenArrays t{4, logp.data(), old.data(), gen.data(), ref.data(), advantage.data(), trained.data(), sample.data()};
  std::vector<float> loss(4), gradient(4);
  LossStatistics s;
  grpo_loss(o, t, 4, loss.data(), gradient.data(), s);
  for (int i : {0, 2}) {
    const double raw = std::exp(static_cast<double>(old[i]) - gen[i]);
    const double ratio = std::exp(static_cast<double>(logp[i]) - old[i]);
    const double logr = static_cast<double>(ref[i]) - logp[i], kl = std::exp(logr) - 1.0 - logr;
    EXPECT_NEAR(loss[i], (raw * -1.0 * ratio + 0.1 * kl) / 4.0, 1e-7) << i;
    EXPECT_NEAR(gradient[i], (raw * -1.0 * ratio + 0.1 * (1.0 - std::exp(logr))) / 4.0, 1e-7) << i;
  }
  for (int i : {1, 3}) {
    const double logr = static_cast<double>(ref[i]) - logp[i];
    EXPECT_NEAR(loss[i], 0.1 * (std::exp(logr) - 1.0 - logr) / 4.0, 1e-7) << i;
    EXPECT_NEAR(gradient[i], 0.1 * (1.0 - std::exp(logr)) / 4.0, 1e-7) << i;
  }
  EXPECT_EQ(s.masked, 2);
  EXPECT_THROW(token_loss(o, -1.0, -1.0, -1.0, -1.0, 1.0, s), Error);  // it needs the token's sample
}

// Central differences of the whole loss (every token of the token's sample moves with its logp)
// in each token's logp, three samples of 2 to 5 trained tokens, for every correction with the KL
// and the dual clip, away from the clip boundaries; and seq_mask_tis over token ratios.
TEST(GspoLoss, GradientsMatchFiniteDifferencesOfTheWholeLoss) {
  LossOptions o = gspo();
  o.kl_coeff = 0.05;
  o.dual_clip = 3.0;
  o.clip_low = o.clip_high = 0.1;
  o.tis_cap = 1.2;
  o.icepop_low = 0.8;
  o.icepop_high = 1.25;
  const int n = 12;
  const std::vector<int32_t> sample = {0, 0, 1, 2, 1, 1, 0, 2, 1, 0, 2, 1};
  const std::vector<uint8_t> trained = {1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 1};
  o.seq_mask_low = 0.97;
  o.seq_mask_high = 1.03;
  int checked = 0;
  // GSPO with each correction, and token ratios with seq_mask_tis.
  for (int variant = 0; variant < 4; ++variant) {
    const config::ImportanceCorrection correction = static_cast<config::ImportanceCorrection>(variant);
    o.correction = correction;
    o.ratio_level = correction == config::ImportanceCorrection::SeqMaskTis ? config::RatioLevel::Token
                                                                           : config::RatioLevel::Sequence;
    for (int trial = 0; trial < 60; ++trial) {
      auto u = [&](int k) { return (philox4x32(17, trial * 64 + k, static_cast<int>(correction))[0] % 100000) / 1e5; };
      std::vector<float> logp(n), old(n), gen(n), ref(n), advantage(n);
      const double advantages[3] = {4.0 * (u(60) - 0.5), 4.0 * (u(61) - 0.5), 4.0 * (u(62) - 0.5)};
      for (int i = 0; i < n; ++i) {
        old[i] = static_cast<float>(-0.2 - 3.0 * u(i));
        logp[i] = static_cast<float>(old[i] + 0.4 * (u(20 + i) - 0.5));
        gen[i] = static_cast<float>(old[i] + 0.2 * (u(40 + i) - 0.5));
        ref[i] = static_cast<float>(old[i] + 0.5 * (u(50 + i % 10) - 0.5));
        advantage[i] = static_cast<float>(advantages[sample[static_cast<size_t>(i)]]);
      }
      TokenArrays t{n, logp.data(), old.data(), gen.data(), ref.data(), advantage.data(), trained.data(),
                    sample.data()};
      std::vector<float> loss(n), gradient(n);
      LossStatistics s;
      grpo_loss(o, t, 9, loss.data(), gradient.data(), s);
      // Skip a trial whose sample ratio or sequence weight sits near an edge.
      bool near_edge = false;
      for (int k = 0; k < 3; ++k) {
        double log_ratio = 0.0, log_weight = 0.0;
        int tokens = 0;
        for (int i = 0; i < n; ++i) {
          if (sample[static_cast<size_t>(i)] != k || trained[static_cast<size_t>(i)] == 0) continue;
          log_ratio += static_cast<double>(logp[i]) - old[i];
          log_weight += static_cast<double>(old[i]) - gen[i];
          ++tokens;
        }
        const double ratio = std::exp(log_ratio / tokens), weight = std::exp(log_weight);
        for (double edge : {1.0 - o.clip_low, 1.0 + o.clip_high, o.dual_clip})
          near_edge = near_edge || std::fabs(ratio - edge) < 1e-3;
        for (double edge : {o.tis_cap, o.icepop_low, o.icepop_high})
          near_edge = near_edge || std::fabs(weight - edge) < 1e-3;
        for (double edge : {o.seq_mask_low, o.seq_mask_high})
          near_edge = near_edge || std::fabs(std::exp(log_weight / tokens) - edge) < 1e-4;
      }
      // Token ratios (seq_mask_tis): each token's own clip edges.
      for (int i = 0; o.ratio_level == config::RatioLevel::Token && i < n; ++i) {
        for (double edge : {1.0 - o.clip_low, 1.0 + o.clip_high})
          near_edge = near_edge || std::fabs(std::exp(static_cast<double>(logp[i]) - old[i]) - edge) < 1e-3;
      }
      if (near_edge) continue;
      // The loss in double at moved logp (float arrays: the step is large enough for their rounding).
      auto total_at = [&](int i, double step) {
        std::vector<float> moved = logp;
        moved[i] = static_cast<float>(moved[i] + step);
        const double actual_step = static_cast<double>(moved[i]) - logp[i];
        TokenArrays m = t;
        m.logp = moved.data();
        std::vector<float> l(n), g(n);
        LossStatistics unused;
        return std::pair{grpo_loss(o, m, 9, l.data(), g.data(), unused), actual_step};
      };
      for (int i = 0; i < n; ++i) {
        if (trained[static_cast<size_t>(i)] == 0) continue;
        const auto [up, h_up] = total_at(i, 1e-3);
        const auto [down, h_down] = total_at(i, -1e-3);
        const double numeric = (up - down) / (h_up - h_down);
        EXPECT_NEAR(gradient[i], numeric, 2e-4 * std::max(0.1, std::fabs(numeric)))
            << "trial " << trial << " token " << i << " correction " << static_cast<int>(correction);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 600);
}

TEST(Overlong, SoftPenaltyInTheLastTokens) {
  EXPECT_EQ(overlong_penalty(15, 20, 5, 1.0), 0.0);
  EXPECT_NEAR(overlong_penalty(16, 20, 5, 1.0), -0.2, 1e-15);
  EXPECT_NEAR(overlong_penalty(18, 20, 5, 2.0), -1.2, 1e-15);
  EXPECT_NEAR(overlong_penalty(20, 20, 5, 1.0), -1.0, 1e-15);
  EXPECT_EQ(overlong_penalty(25, 20, 5, 1.0), -1.0);
  EXPECT_EQ(overlong_penalty(25, 20, 0, 1.0), 0.0);  // no buffer: off
}

TEST(Overlong, ShapingCountsGeneratedTokensAndFilteringMasksTruncatedSamples) {
  RolloutGroup group;
  Rollout short_one, long_one;
  short_one.trained = {0, 0, 1, 1};
  short_one.reward = 1.0;
  long_one.trained = {0, 1, 1, 1, 1, 1, 1, 1};  // 7 generated tokens
  long_one.reward = 1.0;
  long_one.truncated = true;
  group.samples = {short_one, long_one};
  shape_overlong_rewards(group, 8, 4, 1.0);
  EXPECT_EQ(group.samples[0].reward, 1.0);
  EXPECT_NEAR(group.samples[1].reward, 1.0 - 0.75, 1e-15);  // (4 - 7) / 4
  EXPECT_EQ(filter_overlong(group), 1);
  EXPECT_EQ(group.samples[0].trained, short_one.trained);
  for (uint8_t t : group.samples[1].trained) EXPECT_EQ(t, 0);
}

TEST(GrpoConfig, KeysAreDeclaredAndChecked) {
  const config::RunConfig c = config::parse_config(
      "grpo: {clip_low: 0.1, clip_high: 0.28, dual_clip: 3, kl_coeff: 0, importance_correction: icepop}\n", "grpo",
      {});
  const LossOptions o = LossOptions::from_config(c.grpo);
  EXPECT_EQ(o.clip_high, 0.28);
  EXPECT_EQ(o.correction, config::ImportanceCorrection::Icepop);
  auto fails = [](const std::string& yaml, const std::string& needle) {
    try {
      config::parse_config(yaml, "bad", {});
      ADD_FAILURE() << "accepted: " << yaml;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  fails("grpo: {dual_clip: 0.5}\n", "grpo.dual_clip");
  fails("grpo: {importance_correction: tiss}\n", "tis");
  fails("grpo: {clip_lo: 0.1}\n", "clip_low");
  fails("grpo: {icepop_low: 3, icepop_high: 2}\n", "grpo.icepop_low");
  fails("grpo: {overlong_buffer: 8}\n", "grpo.overlong_max_tokens");
  fails("grpo: {loss_aggregation: seq_mean}\n", "seq_mean_token_mean");
  fails("grpo: {ratio_level: sequence}\n",
        "grpo.ratio_level = 'sequence' (GSPO) gives each sample one ratio and one loss: it needs "
        "grpo.loss_aggregation = 'seq_mean_token_mean' (the samples' mean), not 'token_mean'");
  fails("grpo: {ratio_level: sample}\n", "sequence");
  fails("grpo: {seq_mask_low: 1.1, seq_mask_high: 1.05}\n", "grpo.seq_mask_low = 1.1 is invalid");
  fails("grpo: {importance_correction: seq_mask_tis, ratio_level: sequence, loss_aggregation: seq_mean_token_mean}\n",
        "grpo.importance_correction = 'seq_mask_tis' keeps each token's own weight");
  const LossOptions masked = LossOptions::from_config(
      config::parse_config("grpo: {importance_correction: seq_mask_tis, seq_mask_low: 0.9}\n", "grpo", {}).grpo);
  EXPECT_EQ(masked.correction, config::ImportanceCorrection::SeqMaskTis);
  EXPECT_EQ(masked.seq_mask_low, 0.9);
  EXPECT_EQ(masked.seq_mask_high, 1.002);
  EXPECT_EQ(LossOptions::from_config(config::parse_config("grpo: {ratio_level: sequence, loss_aggregation: "
                                                          "seq_mean_token_mean}\n", "grpo", {}).grpo)
                .ratio_level,
            config::RatioLevel::Sequence);
  fails("grpo: {minibatches: 0}\n", "grpo.minibatches");
  fails("grpo: {minibatches: 9, prompts_per_step: 2, samples_per_prompt: 4}\n",
        "grpo.minibatches = 9 updates a step, each on a share of its 8 samples");
  EXPECT_EQ(config::parse_config("grpo: {minibatches: 8, prompts_per_step: 2, samples_per_prompt: 4}\n", "grpo", {})
                .grpo.minibatches,
            8);
}

// grpo.loss_aggregation's factor on a sample of 3 trained tokens in a step of 10 tokens over 4
// samples: the token mean's 1; the sample mean's 10 / (3 x 4), so that the sample's 3 token
// losses over the step's 10 tokens weigh 1/4; Dr. GRPO's 10 / (4 x 2 x 8) with 2 turns of 8
// tokens. A sample without trained tokens gets 0.
TEST(GrpoLoss, SampleFactorsOfEachAggregation) {
  const std::string yaml = "grpo: {loss_aggregation: seq_mean_token_sum_norm, max_turns: 2, max_tokens: 8}\n";
  const config::RunConfig c = config::parse_config(yaml, "grpo", {});
  LossOptions o = LossOptions::from_config(c.grpo);
  EXPECT_EQ(o.aggregation, config::LossAggregation::SeqMeanTokenSumNorm);
  EXPECT_EQ(o.max_sample_tokens, 16);
  EXPECT_DOUBLE_EQ(sample_loss_factor(o, 3, 10, 4), 10.0 / 64.0);
  o.aggregation = config::LossAggregation::SeqMeanTokenMean;
  EXPECT_DOUBLE_EQ(sample_loss_factor(o, 3, 10, 4), 10.0 / 12.0);
  EXPECT_DOUBLE_EQ(3 * sample_loss_factor(o, 3, 10, 4) / 10.0, 0.25);
  EXPECT_EQ(sample_loss_factor(o, 0, 10, 4), 0.0);
  o.aggregation = config::LossAggregation::TokenMean;
  EXPECT_EQ(sample_loss_factor(o, 3, 10, 4), 1.0);
}

}  // namespace
}  // namespace loom::rl
