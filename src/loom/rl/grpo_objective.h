#pragma once
// The GRPO loss (grpo_loss.h) as the trainer's step objective: for each trained target of this
// rank's batch, the head's log-probability logp goes through token_loss with
//   old = the learner's log-probability before the step: in its first update logp, detached (the
//         parameters are still the step's: r = 1 with d r / d logp = 1); in a later update
//         (grpo.minibatches) the value of a forward-only pass over that update's batch before
//         the first update (StepObjective::before_updates), the same again in a later pass over
//         the samples (grpo.epochs; the first update's logp for the first share),
//   generation log-probability and advantage from the batch (TokenBatch's per-target data),
//   reference log-probability from a forward-only pass with the reference parameters
//         (only when kl_coeff > 0),
// each token's loss and gradient times its sample's factor of grpo.loss_aggregation (from the
// count of its sample's trained targets the batch carries per target, which holds under context
// parallelism too, where a rank sees chunks of each sample). With grpo.ratio_level sequence (GSPO)
// or grpo.importance_correction seq_mask_tis a micro-batch's sums over each sample's trained
// targets come first (sample_token_loss): a sample is a document of its row (the whole row
// unpacked), and under context parallelism each rank's sums over its chunks are added over the
// context-parallel group before any token's loss.
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"
#include "loom/rl/grpo_loss.h"
#include "loom/train/step_objective.h"

namespace loom::rl {

class GrpoObjective : public train::StepObjective {
 public:
  // `reference`: a full copy of this rank's reference parameters (Trainer::parameter_copy),
  // outliving the objective; null when options.kl_coeff is 0.
  GrpoObjective(LossOptions options, const Tensor* reference);

  // Each update's trained tokens and the samples that train on any, over every replica's rows
  // (grpo.loss_aggregation's normalisers, RolloutRows::minibatches), the updates passing over
  // `shares` shares of the samples in turn (grpo.epochs passes: update u trains on share
  // u mod shares, the same rows as its first pass); before the trainer's step.
  struct UpdateTotals {
    int64_t tokens = 0, samples = 0;
  };
  void set_step_totals(std::vector<UpdateTotals> totals, int shares);
  void before_updates(train::Trainer& trainer, const train::TokenBatch& batch, int update) override;
  void prepare(train::Trainer& trainer, const train::TokenBatch& batch, int update) override;
  double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) override;
  // grpo.mtp_loss_weight: the depths learn to draft the rollouts' tokens, the policy unaffected.
  double depth_loss_weight() const override { return options_.mtp_loss_weight; }

  // This rank's statistics of the step, every update's (empty on ranks without the head).
  const LossStatistics& statistics() const { return stats_; }

 private:
  // The learner's log-probability before the step of target `i` whose current one is `logp`.
  double old_logp(size_t i, double logp) const;
  // GSPO, seq_mask_tis: the sums of each sample of the micro-batch's `rows` targets from `first`
  // into sample_sums_, at sample_slot's slots, over the context-parallel group.
  void sum_samples(int64_t first, const float* logp, int64_t rows);
  size_t sample_slot(int64_t first, size_t i) const;

  LossOptions options_;
  const Tensor* reference_;
  const train::TokenBatch* batch_ = nullptr;
  // By share: the reference's log-probabilities, and the step's starting parameters' (share 0's
  // kept from the first update only when a later pass reads it again).
  std::vector<std::vector<float>> reference_logp_, old_logp_;
  std::vector<UpdateTotals> totals_;
  int update_ = 0;
  size_t share_ = 0;  // update_'s share
  LossStatistics stats_;
  // GSPO, seq_mask_tis: the context-parallel group, the most samples a row of the update holds
  // (agreed over that group) and a micro-batch's sums, by row and document: log_ratio then
  // log_weight (SampleSums) of each slot.
  comm::Communicator* context_ = nullptr;
  int64_t row_samples_ = 1;
  std::vector<double> sample_sums_;
};

}  // namespace loom::rl
