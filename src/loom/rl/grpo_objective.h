#pragma once
// The GRPO loss (grpo_loss.h) as the trainer's step objective: for each trained target of this
// rank's batch, the head's log-probability logp goes through token_loss with
//   old = logp, detached (one optimizer step per batch: the learner's log-probabilities before
//         the update are the current ones, so r = 1 with d r / d logp = 1),
//   generation log-probability and advantage from the batch (TokenBatch's per-target data),
//   reference log-probability from a forward-only pass with the reference parameters
//         (only when kl_coeff > 0),
// each token's loss and gradient times its sample's factor of grpo.loss_aggregation (from the
// count of its sample's trained targets the batch carries per target, which holds under context
// parallelism too, where a rank sees chunks of each sample).
#include <vector>

#include "loom/core/tensor.h"
#include "loom/rl/grpo_loss.h"
#include "loom/train/step_objective.h"

namespace loom::rl {

class GrpoObjective : public train::StepObjective {
 public:
  // `reference`: a full copy of this rank's reference parameters (Trainer::parameter_copy),
  // outliving the objective; null when options.kl_coeff is 0.
  GrpoObjective(LossOptions options, const Tensor* reference);

  // The step's trained tokens and the samples that train on any, over every replica's rows
  // (grpo.loss_aggregation's normalisers); before the trainer's step.
  void set_step_totals(int64_t tokens, int64_t samples);
  void prepare(train::Trainer& trainer, const train::TokenBatch& batch) override;
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override;
  // grpo.mtp_loss_weight: the depths learn to draft the rollouts' tokens, the policy unaffected.
  double depth_loss_weight() const override { return options_.mtp_loss_weight; }

  // This rank's statistics of the step (empty on ranks without the head).
  const LossStatistics& statistics() const { return stats_; }

 private:
  LossOptions options_;
  const Tensor* reference_;
  const train::TokenBatch* batch_ = nullptr;
  std::vector<float> reference_logp_;
  int64_t step_tokens_ = 0, step_samples_ = 0;
  LossStatistics stats_;
};

}  // namespace loom::rl
