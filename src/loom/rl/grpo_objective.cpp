#include "loom/rl/grpo_objective.h"

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/types.h"
#include "loom/rl/communication.h"
#include "loom/train/trainer.h"

namespace loom::rl {

GrpoObjective::GrpoObjective(LossOptions options, const Tensor* reference)
    : options_(options), reference_(reference) {
  LOOM_CHECK(options_.kl_coeff == 0.0 || reference_ != nullptr,
             "GrpoObjective: grpo.kl_coeff > 0 needs the reference policy's parameters");
  LOOM_CHECK(options_.ratio_level == config::RatioLevel::Token ||
                 options_.aggregation == config::LossAggregation::SeqMeanTokenMean,
             "GrpoObjective: sequence-level ratios need the samples' mean (seq_mean_token_mean)");
}

void GrpoObjective::set_step_totals(std::vector<UpdateTotals> totals, int shares) {
  LOOM_CHECK(shares > 0 && !totals.empty() && totals.size() % static_cast<size_t>(shares) == 0,
             "GrpoObjective: " + std::to_string(totals.size()) + " updates over " + std::to_string(shares) +
                 " shares of the samples");
  totals_ = std::move(totals);
  old_logp_.assign(static_cast<size_t>(shares), {});
  reference_logp_.assign(static_cast<size_t>(shares), {});
}

void GrpoObjective::before_updates(train::Trainer& trainer, const train::TokenBatch& batch, int update) {
  LOOM_CHECK(update > 0 && static_cast<size_t>(update) < totals_.size(),
             "GrpoObjective: update " + std::to_string(update) + " of a step set for " +
                 std::to_string(totals_.size()));
  // A later pass's share has the log-probabilities of its first pass: share 0's are the first
  // update's own (evaluate keeps them), the others' this pass's.
  if (static_cast<size_t>(update) >= old_logp_.size()) return;
  old_logp_[static_cast<size_t>(update)] = trainer.target_logprobs(batch, nullptr);
}

void GrpoObjective::prepare(train::Trainer& trainer, const train::TokenBatch& batch, int update) {
  const size_t n = batch.targets.size();
  LOOM_CHECK(batch.advantages.size() == n && batch.generation_logprobs.size() == n,
             "GrpoObjective: the batch carries no advantages and generation log-probabilities (a rollout source "
             "fills them)");
  LOOM_CHECK(update >= 0 && static_cast<size_t>(update) < totals_.size(),
             "GrpoObjective: update " + std::to_string(update) + " of a step set for " +
                 std::to_string(totals_.size()) + " (set_step_totals)");
  batch_ = &batch;
  update_ = update;
  share_ = static_cast<size_t>(update) % old_logp_.size();
  if (update == 0) {
    stats_ = {};
    // Kept by evaluate when a later pass reads share 0 again.
    if (totals_.size() > old_logp_.size()) old_logp_[0].assign(n, 0.0f);
  }
  LOOM_CHECK(update == 0 || old_logp_[share_].size() == n,
             "GrpoObjective: update " + std::to_string(update) + " has no old log-probabilities (before_updates)");
  // The reference's log-probabilities of a share, once a step.
  if (options_.kl_coeff != 0.0 && reference_logp_[share_].size() != n)
    reference_logp_[share_] = trainer.target_logprobs(batch, reference_);
  const bool by_sample = needs_sample_sums(options_);
  const bool token_mean = options_.aggregation == config::LossAggregation::TokenMean;
  LOOM_CHECK((token_mean && !by_sample) || batch.sample_targets.size() == n,
             "GrpoObjective: grpo.loss_aggregation and sums over whole samples need each target's sample's trained "
             "targets (a rollout source fills them)");
  LOOM_CHECK(token_mean || totals_[static_cast<size_t>(update)].samples > 0,
             "GrpoObjective: grpo.loss_aggregation needs the update's totals (set_step_totals)");
  if (by_sample) {
    // The samples' slots of a micro-batch: its rows x the most documents a row holds, on every
    // context-parallel rank alike (a rank may hold no chunk of a row's last sample).
    context_ = &trainer.context_group();
    int64_t documents = 1;
    for (const int32_t d : batch.documents) documents = std::max<int64_t>(documents, int64_t{d} + 1);
    row_samples_ = max_over_group(*context_, documents);
  }
}

double GrpoObjective::old_logp(size_t i, double logp) const {
  return update_ == 0 ? logp : old_logp_[share_][i];
}

size_t GrpoObjective::sample_slot(int64_t first, size_t i) const {
  const int64_t seq = batch_->seq;
  const int64_t row = static_cast<int64_t>(i) / seq - first / seq;
  const int64_t document = batch_->documents.empty() ? 0 : batch_->documents[i];
  return static_cast<size_t>(row * row_samples_ + document);
}

void GrpoObjective::sum_samples(int64_t first, const float* logp, int64_t rows) {
  const int64_t seq = batch_->seq;
  LOOM_CHECK(first % seq == 0 && rows % seq == 0,
             "GrpoObjective: sums over whole samples need whole rows in each evaluation, got targets " +
                 std::to_string(first) + " + " + std::to_string(rows) + " of rows of " + std::to_string(seq));
  sample_sums_.assign(static_cast<size_t>(2 * (rows / seq) * row_samples_), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    if (batch_->targets[static_cast<size_t>(first + r)] == kernels::kIgnoreIndex) continue;
    const size_t i = static_cast<size_t>(first + r), k = 2 * sample_slot(first, i);
    const double old = old_logp(i, logp[r]);
    sample_sums_[k] += logp[r] - old;
    sample_sums_[k + 1] += old - batch_->generation_logprobs[i];
  }
  sum_samples_over_group(*context_, sample_sums_);
}

double GrpoObjective::evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) {
  LOOM_CHECK(batch_ != nullptr, "GrpoObjective: evaluate before prepare");
  const int64_t first = targets - batch_->targets.data();
  LOOM_CHECK(first >= 0 && first + rows <= static_cast<int64_t>(batch_->targets.size()),
             "GrpoObjective: rows outside the batch it was prepared for");
  const bool by_sample = needs_sample_sums(options_);
  if (by_sample) sum_samples(first, logp, rows);
  double loss_sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    gradient[r] = 0.0f;
    if (targets[r] == kernels::kIgnoreIndex) continue;
    const size_t i = static_cast<size_t>(first + r);
    const double reference = options_.kl_coeff != 0.0 ? reference_logp_[share_][i] : 0.0;
    if (update_ == 0 && !old_logp_[0].empty()) old_logp_[0][i] = logp[r];
    const double generation = batch_->generation_logprobs[i], advantage = batch_->advantages[i];
    const double old = old_logp(i, logp[r]);
    const size_t k = by_sample ? 2 * sample_slot(first, i) : 0;
    const TokenLoss t = by_sample ? sample_token_loss(options_, {sample_sums_[k], sample_sums_[k + 1]},
                                                      batch_->sample_targets[i], logp[r], old, generation, reference,
                                                      advantage, stats_)
                                  : token_loss(options_, logp[r], old, generation, reference, advantage, stats_);
    const UpdateTotals& totals = totals_[static_cast<size_t>(update_)];
    const double factor = options_.aggregation == config::LossAggregation::TokenMean
                              ? 1.0
                              : sample_loss_factor(options_, batch_->sample_targets[i], totals.tokens, totals.samples);
    gradient[r] = static_cast<float>(factor * t.gradient);
    loss_sum += factor * t.loss;
  }
  return loss_sum;
}

}  // namespace loom::rl
