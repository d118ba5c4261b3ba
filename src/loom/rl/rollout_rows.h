#pragma once
// The rows a GRPO learner step trains on, made from rollout groups: each group's rewards shaped
// (DAPO's overlong penalty) and turned into advantages (grpo_loss.h), truncated samples filtered
// when asked; then each sample's inputs (its tokens but the last) and targets (its tokens but the
// first) placed in rows of data.seq_len slots, a target trained on when the model sampled it
// (Rollout::trained) and carrying its sample's advantage, its generation log-probability and its
// sample's count of trained targets (grpo.loss_aggregation's T_i).
//
// grpo.minibatches: the step's samples are split, in order, into that many shares (sizes differing
// by at most one), one optimizer update each, whose rows follow each other; each share is laid out
// as follows. grpo.packing (NeMo RL's sequence packing): the samples are packed into rows by
// first-fit decreasing, each a document of its row (model/packing.h: positions restarting at 0, no
// attention across samples, so a sample computes what it computes alone), and the update takes
// the rows they fill, rounded up to the trainer's batch unit (Trainer::batch_unit), at most
// train.global_batch. Without it, one sample per row and train.global_batch rows. Slots past the
// samples are padding (no trained targets).
#include <span>
#include <string>
#include <vector>

#include "loom/config/grpo_config.h"
#include "loom/rl/rollout.h"
#include "loom/train/batch_source.h"

namespace loom::rl {

// One optimizer update's share of a step's rows.
struct RolloutMinibatch {
  int64_t rows = 0;             // consecutive rows, after the previous update's
  int64_t trained_targets = 0;  // its targets trained on (grpo.loss_aggregation's N)
  int64_t trained_samples = 0;  // its samples with a trained target (S)
};

struct RolloutRows {
  int rows = 0, seq = 0;  // every update's rows
  std::vector<int32_t> inputs, targets;  // [rows, seq]
  // Packed: each slot's position in its sample and the sample's place in its row (the padding
  // after a row's samples a document of its own); empty: one sample per row.
  std::vector<int32_t> positions, documents;
  std::vector<float> weights, advantages, generation_logprobs;
  std::vector<int32_t> sample_targets;  // per slot: the trained targets of its sample (0: padding)
  int64_t samples = 0, zero_variance_groups = 0, filtered_samples = 0;
  int64_t filled_rows = 0;      // rows holding a sample
  double packing_efficiency = 0.0;  // the share of the step's slots holding a sample's input
  std::vector<RolloutMinibatch> minibatches;  // grpo.minibatches of them, in order, with their counts
  double reward_sum = 0.0, reward_min = 0.0, reward_max = 0.0;  // after shaping
};

// `max_rows`: train.global_batch; `row_unit`: what a packed update's rows are a multiple of.
// Throws an Error naming the group and sample when a rollout does not fit (fewer than 2 tokens,
// more than seq + 1, mismatched arrays), naming train.global_batch when an update's samples need
// more rows than it, and grpo.minibatches when the step has fewer samples than updates.
RolloutRows make_rollout_rows(const std::vector<RolloutGroup>& groups, const config::GrpoConfig& grpo, int max_rows,
                              int seq, int64_t row_unit);

// The trainer's batch source over one step's rows: global samples first, first + 1, ... of the
// step beginning at `first_sample` are rows 0, 1, ... (every rank holds all rows), `passes` times
// over (grpo.epochs: the step's updates read its rows again, pass after pass).
class RolloutSource : public train::BatchSource {
 public:
  void set(RolloutRows rows, int64_t first_sample, int passes = 1);
  void fill(int64_t first, train::TokenBatch& batch) const override;
  std::string describe() const override { return "GRPO rollouts"; }

 private:
  RolloutRows rows_;
  int64_t first_sample_ = 0;
  int passes_ = 1;
};

}  // namespace loom::rl
