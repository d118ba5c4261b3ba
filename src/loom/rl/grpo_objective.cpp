#include "loom/rl/grpo_objective.h"

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/types.h"
#include "loom/train/trainer.h"

namespace loom::rl {

GrpoObjective::GrpoObjective(LossOptions options, const Tensor* reference)
    : options_(options), reference_(reference) {
  LOOM_CHECK(options_.kl_coeff == 0.0 || reference_ != nullptr,
             "GrpoObjective: grpo.kl_coeff > 0 needs the reference policy's parameters");
}

void GrpoObjective::set_step_totals(int64_t tokens, int64_t samples) {
  step_tokens_ = tokens;
  step_samples_ = samples;
}

void GrpoObjective::prepare(train::Trainer& trainer, const train::TokenBatch& batch) {
  const size_t n = batch.targets.size();
  LOOM_CHECK(batch.advantages.size() == n && batch.generation_logprobs.size() == n,
             "GrpoObjective: the batch carries no advantages and generation log-probabilities (a rollout source "
             "fills them)");
  batch_ = &batch;
  stats_ = {};
  reference_logp_.clear();
  if (options_.kl_coeff != 0.0) reference_logp_ = trainer.target_logprobs(batch, reference_);
  factors_.assign(batch.targets.size(), 1.0);
  if (options_.aggregation == config::LossAggregation::TokenMean) return;
  LOOM_CHECK(step_samples_ > 0, "GrpoObjective: grpo.loss_aggregation needs the step's totals (set_step_totals)");
  // A sample is a row's run of one document id (packed rows), or the whole row.
  const auto seq = static_cast<size_t>(batch.seq);
  for (size_t row = 0; row < batch.targets.size(); row += seq) {
    for (size_t begin = row, end = row; begin < row + seq; begin = end) {
      end = batch.documents.empty() ? row + seq : begin + 1;
      while (end < row + seq && batch.documents[end] == batch.documents[begin]) ++end;
      const auto first = batch.targets.begin() + static_cast<std::ptrdiff_t>(begin);
      const int64_t trained = std::count_if(first, first + static_cast<std::ptrdiff_t>(end - begin),
                                            [](int32_t t) { return t != kernels::kIgnoreIndex; });
      const double factor = sample_loss_factor(options_, trained, step_tokens_, step_samples_);
      std::fill(factors_.begin() + static_cast<std::ptrdiff_t>(begin),
                factors_.begin() + static_cast<std::ptrdiff_t>(end), factor);
    }
  }
}

double GrpoObjective::evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) {
  LOOM_CHECK(batch_ != nullptr, "GrpoObjective: evaluate before prepare");
  const int64_t first = targets - batch_->targets.data();
  LOOM_CHECK(first >= 0 && first + rows <= static_cast<int64_t>(batch_->targets.size()),
             "GrpoObjective: rows outside the batch it was prepared for");
  double loss_sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    gradient[r] = 0.0f;
    if (targets[r] == kernels::kIgnoreIndex) continue;
    const size_t i = static_cast<size_t>(first + r);
    const double reference = reference_logp_.empty() ? 0.0 : reference_logp_[i];
    const TokenLoss t = token_loss(options_, logp[r], logp[r], batch_->generation_logprobs[i], reference,
                                   batch_->advantages[i], stats_);
    const double factor = factors_[i];
    gradient[r] = static_cast<float>(factor * t.gradient);
    loss_sum += factor * t.loss;
  }
  return loss_sum;
}

}  // namespace loom::rl
