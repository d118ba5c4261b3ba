#pragma once
// The GRPO loss as NeMo RL defines it (ClippedPGLossFn), as pure functions over plain arrays:
// group-relative advantages, the clipped policy-gradient objective per sampled token with an
// importance-sampling correction for off-policy data and a KL penalty (k1, k2 or k3) to a frozen
// reference policy, and DAPO's overlong shaping and filtering. docs/grpo.md gives the formulas.
//
// Per token t with log-probability logp (the learner's, the only input that carries a gradient),
// old log-probability old (the learner's before the update, detached), generation log-probability
// gen (the server's), reference log-probability ref and advantage A:
//   r = exp(logp - old)
//   pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high));  A < 0 and dual_clip c > 1: min(pg, -A c)
//   w = exp(old - gen), then none: 1 | tis: min(w, tis_cap) | icepop: w in [low, high] ? w : 0 |
//       seq_mask_tis: w where the sample's exp(mean(old - gen)) is in [seq_mask_low, seq_mask_high], else 0
//   kl = k3: exp(logr) - logr - 1 (k1: -logr, k2: logr^2 / 2) of logr = ref - logp, logr and kl
//        optionally clamped; with on_policy_kl times exp(logp - gen) (detached)
//   loss_t = (w pg + kl_coeff kl) / N      N = the global count of trained tokens
// With grpo.ratio_level sequence (GSPO) a sample's tokens share r and w, and seq_mask_tis masks
// whole samples (sample_token_loss).
#include <cstdint>
#include <vector>

#include "loom/config/grpo_config.h"
#include "loom/rl/rollout.h"

namespace loom::rl {

// ---- advantages

struct GroupAdvantages {
  std::vector<double> advantages;  // one per sample
  bool zero_variance = false;      // every reward equal (or one sample): every advantage is 0
};

// NeMo RL's rule (calculate_baseline_and_std_per_prompt): A_i = r_i - b_i, b_i the mean of the
// baseline's m rewards: the other samples' (leave_one_out, RLOO's unbiased baseline; m = n - 1)
// or the whole group's (m = n, the GRPO paper's). With `normalize_std`, A_i is divided by
// (s_i + epsilon), s_i the Bessel-corrected standard deviation of those m rewards,
// sqrt((mean(r^2) - mean(r)^2) m / (m - 1)) (0 when m < 2), where s_i > 0; a sample whose s_i is 0
// keeps A_i. A group whose rewards are all equal (or of one sample) contributes nothing.
struct AdvantageOptions {
  bool leave_one_out = true;
  bool normalize_std = true;
  double std_epsilon = 1e-6;
  static AdvantageOptions from_config(const config::GrpoConfig& grpo);
};
GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& options);

// ---- the per-token objective

struct LossOptions {
  double clip_low = 0.2, clip_high = 0.2;
  double dual_clip = 0.0;  // 0: off; else c > 1
  double kl_coeff = 0.01;  // 0: no reference policy, no KL term
  config::KlType kl_type = config::KlType::K3;
  double kl_input_clamp = 0.0, kl_output_clamp = 0.0;  // 0: off
  // The KL term weighted by exp(logp - gen), detached (NeMo RL's use_on_policy_kl_approximation):
  // the tokens were sampled by the generation policy, so the plain k3 mean estimates the KL under
  // that policy; weighted, under the current one.
  bool on_policy_kl = false;
  config::ImportanceCorrection correction = config::ImportanceCorrection::None;
  double tis_cap = 2.0;
  double icepop_low = 0.5, icepop_high = 5.0;
  double seq_mask_low = 0.999, seq_mask_high = 1.002;
  config::LossAggregation aggregation = config::LossAggregation::TokenMean;
  config::RatioLevel ratio_level = config::RatioLevel::Token;
  int64_t max_sample_tokens = 1;  // seq_mean_token_sum_norm's length: the largest environment's max_turns x max_tokens
  double mtp_loss_weight = 0.0;    // the depths' draft loss beside it (TokenObjective::depth_loss_weight)
  static LossOptions from_config(const config::GrpoConfig& grpo);
};

// The factor on one sample's token losses that turns the trainer's token mean (the sum over the
// step's trained tokens, `step_tokens`, of every sample) into grpo.loss_aggregation's loss:
// token_mean 1; seq_mean_token_mean step_tokens / (sample_tokens x step_samples), each sample's
// token mean averaged over the step's samples that train on any token; seq_mean_token_sum_norm
// step_tokens / (step_samples x max_sample_tokens). 0 for a sample without trained tokens.
double sample_loss_factor(const LossOptions& options, int64_t sample_tokens, int64_t step_tokens,
                          int64_t step_samples);

// Sums over tokens; merged over micro-batches and ranks (sums added, min/max taken).
struct LossStatistics {
  int64_t tokens = 0;                // trained tokens seen
  double loss_sum = 0.0;             // sum of unnormalised token losses (w pg + kl_coeff kl)
  double kl_sum = 0.0;               // sum of kl (without the coefficient); 0 without a reference
  int64_t clipped_low = 0;           // A < 0 and r < 1 - clip_low: the gradient is clipped away
  int64_t clipped_high = 0;          // A > 0 and r > 1 + clip_high
  int64_t dual_clipped = 0;          // A < 0 and r > dual_clip
  double weight_sum = 0.0;           // raw importance weights exp(old - gen) (0 where not finite)
  double weight_min = 0.0, weight_max = 0.0;
  int64_t masked = 0;                // icepop, seq_mask_tis: weights set to 0
  int64_t truncated = 0;             // tis: weights above the cap, set to it
  // The generation policy against the learner's before the update, summed over tokens (NeMo RL's
  // metrics of their mismatch): exp(|old - gen|), the KL (grpo.kl_type's estimator, unclamped)
  // of the generation policy to the learner's (logr = old - gen) and of the learner's to it
  // (logr = gen - old), their Jensen-Shannon divergence, and -exp(logp - gen) logp (the
  // policy's entropy estimated on the generation policy's samples). Non-finite terms count 0.
  double mult_prob_error_sum = 0.0, generation_kl_sum = 0.0, policy_kl_sum = 0.0;
  double js_divergence_sum = 0.0, entropy_sum = 0.0;
  void add(const LossStatistics& other);
  double clip_low_fraction() const { return fraction(clipped_low); }
  double clip_high_fraction() const { return fraction(clipped_high); }
  double dual_clip_fraction() const { return fraction(dual_clipped); }
  double masked_fraction() const { return fraction(masked); }
  double truncated_fraction() const { return fraction(truncated); }
  double kl_mean() const { return mean(kl_sum); }
  double weight_mean() const { return mean(weight_sum); }
  double mean(double sum) const { return tokens > 0 ? sum / static_cast<double>(tokens) : 0.0; }

 private:
  double fraction(int64_t count) const { return tokens > 0 ? static_cast<double>(count) / static_cast<double>(tokens) : 0.0; }
};

struct TokenLoss {
  double loss = 0.0;      // w pg + kl_coeff kl (unnormalised)
  double gradient = 0.0;  // d(loss)/d(logp)
};

// Schulman's estimator `type` of a KL at logr (the log-ratio of the distribution it is to over the
// one that sampled): k1 -logr, k2 logr^2 / 2, k3 exp(logr) - 1 - logr.
double kl_estimate(config::KlType type, double logr);

// One trained token's loss and gradient (`ref` is read only when kl_coeff > 0); adds it to `stats`.
TokenLoss token_loss(const LossOptions& options, double logp, double old_logp, double generation_logp,
                     double reference_logp, double advantage, LossStatistics& stats);

// ---- What needs the whole sample: GSPO's ratio and weight (grpo.ratio_level: sequence), and
// seq_mask_tis's mask (grpo.importance_correction)
//
// seq_mask_tis keeps each token's own raw weight exp(old - gen) where its sample's geometric-mean
// weight exp(sum(old - gen) / T) lies in [seq_mask_low, seq_mask_high] and zeroes every weight of
// the sample elsewhere (NeMo RL's seq-mask-tis). GSPO gives a sample one ratio and one weight,
//   s = exp(sum(logp - old) / T)    the geometric mean of its token ratios, clipped as r is
//   w_raw = exp(sum(old - gen))     its sequence likelihood ratio to the generation policy, then
//                                   corrected (tis, icepop) as a token's
// and every trained token of it carries w pg(s) (+ its own kl_coeff kl). As d s / d logp_t = s / T,
// d(sum over the sample's tokens of w pg(s)) / d logp_t = w pg'(s) s: the token gradient with r
// replaced by s, zero where s is clipped (for all the sample's tokens at once), which a sample's
// loss factor (sample_loss_factor) scales as it scales the loss.
struct SampleSums {
  double log_ratio = 0.0;   // sum of logp - old over the sample's trained tokens
  double log_weight = 0.0;  // sum of old - gen over them
};
// Whether `options` need each sample's sums (sample_token_loss in place of token_loss).
bool needs_sample_sums(const LossOptions& options);
// One trained token of a sample of `sample_tokens` trained tokens whose sums are `sample`; adds
// it to `stats` (under GSPO its clip counts and raw weight the sample's).
TokenLoss sample_token_loss(const LossOptions& options, const SampleSums& sample, int64_t sample_tokens,
                            double logp, double old_logp, double generation_logp, double reference_logp,
                            double advantage, LossStatistics& stats);

// Per-token arrays of `count` tokens (reference may be null when kl_coeff is 0). Tokens with
// trained[t] = 0 get loss and gradient 0. loss[t] and gradient[t] are divided by
// `global_tokens`, the trained tokens of the whole global batch, so their sum over every rank's
// tokens is the token-level mean. Returns this array's share of the loss (the sum of loss[t]).
struct TokenArrays {
  int64_t count = 0;
  const float* logp = nullptr;
  const float* old_logp = nullptr;
  const float* generation_logp = nullptr;
  const float* reference_logp = nullptr;
  const float* advantage = nullptr;
  const uint8_t* trained = nullptr;
  // needs_sample_sums: each token's sample, numbered from 0 (the sums over its trained tokens
  // here make the sample's ratio, weight or mask).
  const int32_t* sample = nullptr;
};
double grpo_loss(const LossOptions& options, const TokenArrays& tokens, int64_t global_tokens, float* loss,
                 float* gradient, LossStatistics& stats);

// ---- DAPO's overlong options

// The soft overlong penalty of a response of `length` generated tokens with the limit
// `max_tokens` and a buffer of the last `buffer` tokens: 0 up to max_tokens - buffer, then
// falling linearly to -factor at max_tokens, -factor beyond.
double overlong_penalty(int64_t length, int64_t max_tokens, int64_t buffer, double factor);
// Adds overlong_penalty to each sample's reward (its length: its trained tokens).
void shape_overlong_rewards(RolloutGroup& group, int64_t max_tokens, int64_t buffer, double factor);
// Truncated samples leave the loss: their trained marks are cleared (their rewards still count in
// the group's advantages, as NeMo RL's overlong filtering). Returns the number filtered.
int filter_overlong(RolloutGroup& group);

}  // namespace loom::rl
