#pragma once
// The rows a GRPO learner step trains on, made from rollout groups: each group's rewards shaped
// (DAPO's overlong penalty) and turned into advantages (grpo_loss.h), truncated samples filtered
// when asked, then one sample per row, padded to data.seq_len: inputs are the sample's tokens but
// the last, targets its tokens but the first, and a target is trained on when the model sampled it
// (Rollout::trained); every target carries its sample's advantage and its generation
// log-probability. Rows beyond the samples are padding (no trained targets).
#include <string>
#include <vector>

#include "loom/config/grpo_config.h"
#include "loom/rl/rollout.h"
#include "loom/train/batch_source.h"

namespace loom::rl {

struct RolloutRows {
  int rows = 0, seq = 0;
  std::vector<int32_t> inputs, targets;  // [rows, seq]
  std::vector<float> weights, advantages, generation_logprobs;
  int64_t samples = 0, zero_variance_groups = 0, filtered_samples = 0;
  double reward_sum = 0.0, reward_min = 0.0, reward_max = 0.0;  // after shaping
};

// Throws an Error naming the group and sample when a rollout does not fit (fewer than 2 tokens,
// more than seq + 1, mismatched arrays) or the samples exceed `rows` (train.global_batch).
RolloutRows make_rollout_rows(const std::vector<RolloutGroup>& groups, const config::GrpoConfig& grpo, int rows, int seq);

// The rows' trained targets, and the rows (samples) with at least one.
int64_t trained_targets(const RolloutRows& rows);
int64_t samples_in_training(const RolloutRows& rows);

// The trainer's batch source over one step's rows: global samples first, first + 1, ... of the
// step beginning at `first_sample` are rows 0, 1, ... (every rank holds all rows).
class RolloutSource : public train::BatchSource {
 public:
  void set(RolloutRows rows, int64_t first_sample);
  void fill(int64_t first, train::TokenBatch& batch) const override;
  std::string describe() const override { return "GRPO rollouts"; }

 private:
  RolloutRows rows_;
  int64_t first_sample_ = 0;
};

}  // namespace loom::rl
