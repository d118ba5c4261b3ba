#include "loom/rl/grpo_loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "loom/config/grpo_environments.h"
#include "loom/core/error.h"

namespace loom::rl {

AdvantageOptions AdvantageOptions::from_config(const config::GrpoConfig& grpo) {
  return {grpo.leave_one_out, grpo.normalize_std, grpo.std_epsilon};
}

GroupAdvantages group_advantages(const std::vector<double>& rewards, const AdvantageOptions& options) {
  const size_t n = rewards.size();
  GroupAdvantages out;
  out.advantages.assign(n, 0.0);
  const bool all_equal = n < 2 || std::all_of(rewards.begin(), rewards.end(), [&](double r) { return r == rewards[0]; });
  if (all_equal) {
    out.zero_variance = true;
    return out;
  }
  double sum = 0.0, sum_sq = 0.0;
  for (double r : rewards) {
    sum += r;
    sum_sq += r * r;
  }
  const double m = static_cast<double>(options.leave_one_out ? n - 1 : n);  // the baseline's rewards
  for (size_t i = 0; i < n; ++i) {
    const double own = options.leave_one_out ? rewards[i] : 0.0;
    const double mean = (sum - own) / m;
    const double mean_sq = (sum_sq - own * own) / m;
    double advantage = rewards[i] - mean;
    if (options.normalize_std && m >= 2.0) {
      const double std = std::sqrt(std::max(0.0, (mean_sq - mean * mean) * m / (m - 1.0)));
      if (std > 0.0) advantage /= std + options.std_epsilon;
    }
    out.advantages[i] = advantage;
  }
  return out;
}

LossOptions LossOptions::from_config(const config::GrpoConfig& grpo) {
  LossOptions o;
  o.clip_low = grpo.clip_low;
  o.clip_high = grpo.clip_high;
  o.dual_clip = grpo.dual_clip;
  o.kl_coeff = grpo.kl_coeff;
  o.kl_type = grpo.kl_type;
  o.kl_input_clamp = grpo.kl_input_clamp;
  o.kl_output_clamp = grpo.kl_output_clamp;
  o.on_policy_kl = grpo.on_policy_kl;
  o.correction = grpo.importance_correction;
  o.tis_cap = grpo.tis_cap;
  o.icepop_low = grpo.icepop_low;
  o.icepop_high = grpo.icepop_high;
  o.seq_mask_low = grpo.seq_mask_low;
  o.seq_mask_high = grpo.seq_mask_high;
  o.aggregation = grpo.loss_aggregation;
  o.ratio_level = grpo.ratio_level;
  o.max_sample_tokens = config::max_sample_tokens(grpo);
  o.mtp_loss_weight = grpo.mtp_loss_weight;
  return o;
}

double sample_loss_factor(const LossOptions& options, int64_t sample_tokens, int64_t step_tokens,
                          int64_t step_samples) {
  if (sample_tokens <= 0 || step_samples <= 0) return 0.0;
  const double tokens = static_cast<double>(step_tokens), samples = static_cast<double>(step_samples);
  switch (options.aggregation) {
    case config::LossAggregation::TokenMean:
      return 1.0;
    case config::LossAggregation::SeqMeanTokenMean:
      return tokens / (static_cast<double>(sample_tokens) * samples);
    case config::LossAggregation::SeqMeanTokenSumNorm:
      return tokens / (samples * static_cast<double>(options.max_sample_tokens));
  }
  return 1.0;
}

void LossStatistics::add(const LossStatistics& o) {
  if (o.tokens == 0) return;
  weight_min = tokens == 0 ? o.weight_min : std::min(weight_min, o.weight_min);
  weight_max = tokens == 0 ? o.weight_max : std::max(weight_max, o.weight_max);
  tokens += o.tokens;
  loss_sum += o.loss_sum;
  kl_sum += o.kl_sum;
  clipped_low += o.clipped_low;
  clipped_high += o.clipped_high;
  dual_clipped += o.dual_clipped;
  weight_sum += o.weight_sum;
  masked += o.masked;
  truncated += o.truncated;
  mult_prob_error_sum += o.mult_prob_error_sum;
  generation_kl_sum += o.generation_kl_sum;
  policy_kl_sum += o.policy_kl_sum;
  js_divergence_sum += o.js_divergence_sum;
  entropy_sum += o.entropy_sum;
}

double kl_estimate(config::KlType type, double logr) {
  switch (type) {
    case config::KlType::K1:
      return -logr;
    case config::KlType::K2:
      return 0.5 * logr * logr;
    case config::KlType::K3:
      return std::exp(logr) - 1.0 - logr;
  }
  return 0.0;
}

namespace {

// The importance weight used for a token whose raw weight is `raw` (in a sample seq_mask_tis
// keeps, `sample_kept`), counting what was changed.
double corrected_weight(const LossOptions& o, double raw, bool sample_kept, LossStatistics& stats) {
  switch (o.correction) {
    case config::ImportanceCorrection::None:
      return 1.0;
    case config::ImportanceCorrection::Tis:
      if (raw > o.tis_cap) {
        ++stats.truncated;
        return o.tis_cap;
      }
      return raw;
    case config::ImportanceCorrection::Icepop:
      if (raw < o.icepop_low || raw > o.icepop_high) {
        ++stats.masked;
        return 0.0;
      }
      return raw;
    case config::ImportanceCorrection::SeqMaskTis:
      if (!sample_kept) {
        ++stats.masked;
        return 0.0;
      }
      return raw;
  }
  return 1.0;
}

// The clipped policy-gradient term -A r (pessimistic over the clipped ratio, and the dual clip)
// and its derivative in logp (d r / d logp = r: old is detached).
TokenLoss policy_gradient(const LossOptions& o, double ratio, double advantage, LossStatistics& stats) {
  const double clamped = std::clamp(ratio, 1.0 - o.clip_low, 1.0 + o.clip_high);
  const double unclipped = -advantage * ratio, clipped = -advantage * clamped;
  if (clipped > unclipped) {  // the clamp is active and wins: no gradient
    if (ratio < 1.0 - o.clip_low) ++stats.clipped_low;
    if (ratio > 1.0 + o.clip_high) ++stats.clipped_high;
    return {clipped, 0.0};
  }
  if (o.dual_clip > 0.0 && advantage < 0.0 && -advantage * o.dual_clip < unclipped) {
    ++stats.dual_clipped;
    return {-advantage * o.dual_clip, 0.0};
  }
  return {unclipped, -advantage * ratio};
}

// The KL term to the reference of a token (grpo.kl_type over logr = ref - logp, each clamp
// stopping the gradient where it acts) and its derivative in logp.
TokenLoss reference_kl(const LossOptions& o, double logp, double reference_logp) {
  double logr = reference_logp - logp, dlogr = -1.0;
  if (o.kl_input_clamp > 0.0 && std::fabs(logr) > o.kl_input_clamp) {
    logr = std::clamp(logr, -o.kl_input_clamp, o.kl_input_clamp);
    dlogr = 0.0;
  }
  TokenLoss kl{kl_estimate(o.kl_type, logr), 0.0};
  switch (o.kl_type) {  // d kl / d logr, times d logr / d logp
    case config::KlType::K1:
      kl.gradient = -dlogr;
      break;
    case config::KlType::K2:
      kl.gradient = logr * dlogr;
      break;
    case config::KlType::K3:
      kl.gradient = (kl.loss + logr) * dlogr;  // e^logr - 1 = k3 + logr
      break;
  }
  if (o.kl_output_clamp > 0.0 && std::fabs(kl.loss) > o.kl_output_clamp) {
    kl.loss = std::clamp(kl.loss, -o.kl_output_clamp, o.kl_output_clamp);
    kl.gradient = 0.0;
  }
  return kl;
}

double finite_or_zero(double value) { return std::isfinite(value) ? value : 0.0; }

// The mismatch of the generation policy and the learner's before the update, at one token.
void add_mismatch(const LossOptions& o, double logp, double old_logp, double generation_logp, LossStatistics& mine) {
  mine.mult_prob_error_sum = finite_or_zero(std::exp(std::fabs(old_logp - generation_logp)));
  mine.generation_kl_sum = finite_or_zero(kl_estimate(o.kl_type, old_logp - generation_logp));
  mine.policy_kl_sum = finite_or_zero(kl_estimate(o.kl_type, generation_logp - old_logp));
  // Each distribution's k3 to their mixture M: log M = log((p_old + p_gen) / 2).
  const double high = std::max(old_logp, generation_logp);
  const double log_mixture = high + std::log(0.5 * (std::exp(old_logp - high) + std::exp(generation_logp - high)));
  const double js = 0.5 * kl_estimate(config::KlType::K3, old_logp - log_mixture) +
                    0.5 * kl_estimate(config::KlType::K3, generation_logp - log_mixture);
  mine.js_divergence_sum = finite_or_zero(js);
  mine.entropy_sum = finite_or_zero(-std::exp(logp - generation_logp) * logp);
}

// A trained token's loss at the PPO ratio `ratio` with the raw importance weight `raw`, both
// the token's own or its sample's (GSPO), in a sample seq_mask_tis keeps or not; its KL term and
// mismatch statistics are always its own.
TokenLoss loss_at(const LossOptions& o, double ratio, double raw, bool sample_kept, double logp, double old_logp,
                  double generation_logp, double reference_logp, double advantage, LossStatistics& stats) {
  LossStatistics mine;
  mine.tokens = 1;
  if (!std::isfinite(raw)) raw = 0.0;  // as NeMo RL's nan_to_num
  mine.weight_sum = mine.weight_min = mine.weight_max = raw;
  add_mismatch(o, logp, old_logp, generation_logp, mine);
  const double weight = corrected_weight(o, raw, sample_kept, mine);
  const TokenLoss pg = policy_gradient(o, ratio, advantage, mine);
  TokenLoss out{weight * pg.loss, weight * pg.gradient};
  if (o.kl_coeff != 0.0) {
    double on_policy = o.on_policy_kl ? std::exp(logp - generation_logp) : 1.0;
    if (!std::isfinite(on_policy)) on_policy = 0.0;  // as NeMo RL's nan_to_num
    const TokenLoss kl = reference_kl(o, logp, reference_logp);
    mine.kl_sum = on_policy * kl.loss;
    out.loss += o.kl_coeff * on_policy * kl.loss;
    out.gradient += o.kl_coeff * on_policy * kl.gradient;  // the weight detached
  }
  mine.loss_sum = out.loss;
  stats.add(mine);
  return out;
}

}  // namespace

TokenLoss token_loss(const LossOptions& o, double logp, double old_logp, double generation_logp,
                     double reference_logp, double advantage, LossStatistics& stats) {
  LOOM_CHECK(!needs_sample_sums(o), "token_loss: these options need the token's sample (sample_token_loss)");
  return loss_at(o, std::exp(logp - old_logp), std::exp(old_logp - generation_logp), true, logp, old_logp,
                 generation_logp, reference_logp, advantage, stats);
}

bool needs_sample_sums(const LossOptions& o) {
  return o.ratio_level == config::RatioLevel::Sequence || o.correction == config::ImportanceCorrection::SeqMaskTis;
}

TokenLoss sample_token_loss(const LossOptions& o, const SampleSums& sample, int64_t sample_tokens, double logp,
                            double old_logp, double generation_logp, double reference_logp, double advantage,
                            LossStatistics& stats) {
  LOOM_CHECK(sample_tokens > 0, "sample_token_loss: a trained token of a sample without trained tokens");
  const double tokens = static_cast<double>(sample_tokens);
  const double mean_weight = std::exp(sample.log_weight / tokens);
  const bool kept = mean_weight >= o.seq_mask_low && mean_weight <= o.seq_mask_high;
  if (o.ratio_level == config::RatioLevel::Sequence) {
    return loss_at(o, std::exp(sample.log_ratio / tokens), std::exp(sample.log_weight), kept, logp, old_logp,
                   generation_logp, reference_logp, advantage, stats);
  }
  return loss_at(o, std::exp(logp - old_logp), std::exp(old_logp - generation_logp), kept, logp, old_logp,
                 generation_logp, reference_logp, advantage, stats);
}

double grpo_loss(const LossOptions& options, const TokenArrays& t, int64_t global_tokens, float* loss, float* gradient,
                 LossStatistics& stats) {
  const bool by_sample = needs_sample_sums(options);
  LOOM_CHECK(!by_sample || t.sample != nullptr, "grpo_loss: these options need each token's sample");
  // GSPO, seq_mask_tis: each sample's sums and trained tokens first.
  std::vector<SampleSums> sums;
  std::vector<int64_t> sample_tokens;
  for (int64_t i = 0; by_sample && i < t.count; ++i) {
    if (t.trained[i] == 0) continue;
    LOOM_CHECK(t.sample[i] >= 0,
               "grpo_loss: token " + std::to_string(i) + " has sample " + std::to_string(t.sample[i]));
    const size_t k = static_cast<size_t>(t.sample[i]);
    if (k >= sums.size()) {
      sums.resize(k + 1);
      sample_tokens.resize(k + 1, 0);
    }
    sums[k].log_ratio += static_cast<double>(t.logp[i]) - t.old_logp[i];
    sums[k].log_weight += static_cast<double>(t.old_logp[i]) - t.generation_logp[i];
    ++sample_tokens[k];
  }
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, global_tokens));
  double total = 0.0;
  for (int64_t i = 0; i < t.count; ++i) {
    loss[i] = gradient[i] = 0.0f;
    if (t.trained[i] == 0) continue;
    const double ref = t.reference_logp != nullptr ? t.reference_logp[i] : 0.0;
    const size_t k = by_sample ? static_cast<size_t>(t.sample[i]) : 0;
    const TokenLoss one =
        by_sample ? sample_token_loss(options, sums[k], sample_tokens[k], t.logp[i], t.old_logp[i],
                                      t.generation_logp[i], ref, t.advantage[i], stats)
                  : token_loss(options, t.logp[i], t.old_logp[i], t.generation_logp[i], ref, t.advantage[i], stats);
    loss[i] = static_cast<float>(one.loss * scale);
    gradient[i] = static_cast<float>(one.gradient * scale);
    total += one.loss * scale;
  }
  return total;
}

double overlong_penalty(int64_t length, int64_t max_tokens, int64_t buffer, double factor) {
  if (buffer <= 0 || length <= max_tokens - buffer) return 0.0;
  if (length > max_tokens) return -factor;
  return factor * static_cast<double>((max_tokens - buffer) - length) / static_cast<double>(buffer);
}

void shape_overlong_rewards(RolloutGroup& group, int64_t max_tokens, int64_t buffer, double factor) {
  for (Rollout& sample : group.samples) {
    int64_t length = 0;
    for (uint8_t t : sample.trained) length += t != 0 ? 1 : 0;
    sample.reward += overlong_penalty(length, max_tokens, buffer, factor);
  }
}

int filter_overlong(RolloutGroup& group) {
  int filtered = 0;
  for (Rollout& sample : group.samples) {
    if (!sample.truncated) continue;
    std::fill(sample.trained.begin(), sample.trained.end(), uint8_t{0});
    ++filtered;
  }
  return filtered;
}

}  // namespace loom::rl
