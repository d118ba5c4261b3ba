#pragma once
// The GRPO learner: one rank's share of the trainer (any layout: dp with ZeRO 0-3, tp with
// sequence parallelism, cp, pp; recompute; mixed precision) training the
// GRPO loss on rollout groups. Every learner rank calls each method with the same arguments
// (the methods are collective over `world`):
//
//   GrpoLearner learner(config, world, std::cout);   // restores train.resume / train.init_from
//   while (...) {
//     std::vector<RolloutGroup> groups = ...;        // the same groups on every learner rank
//     LearnerStep m = learner.step(groups);          // minibatches x epochs updates; m.step = new version
//     learner.save();                                // a checkpoint the generation side refits from
//   }
//   learner.finish();
//
// A step computes the group advantages (and DAPO's overlong shaping and filtering, when set),
// places its samples in rows of data.seq_len (grpo.packing: packed, the step taking the rows they
// fill; else one per row, train.global_batch rows), and takes one optimizer update on the token
// mean of the GRPO loss over the global batch's trained tokens (grpo_loss.h; the `grpo` config
// section), or grpo.minibatches of them, each on its share of the samples (and grpo.epochs passes
// over those), the later ones' ratios to the log-probabilities of the parameters the step
// started from (PPO's minibatches and epochs).
// With grpo.kl_coeff > 0 the reference policy is the run's starting point: train.init_from's
// parameters, or the seed's initialisation without it; its log-probabilities come from a
// forward-only pass with its parameters in the same layout.
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/rl/rollout.h"

namespace loom::train {
class Trainer;
}

namespace loom::rl {

// What one learner step did; the same on every rank.
struct LearnerStep {
  int64_t step = 0;             // the learner step just taken: the weight version it produced
  double loss = 0.0;            // mean GRPO token loss over the global batch's trained tokens
  int64_t trained_tokens = 0;
  int64_t samples = 0, zero_variance_groups = 0, filtered_samples = 0;
  int64_t rows = 0;              // rows the step trained on (grpo.packing: the rows its samples fill)
  double packing_efficiency = 0.0;  // the share of those rows' slots holding a sample's input
  double reward_mean = 0.0, reward_min = 0.0, reward_max = 0.0;  // after overlong shaping
  double kl = 0.0;              // mean KL (grpo.kl_type) to the reference over trained tokens (0 without one)
  double clip_low_fraction = 0.0, clip_high_fraction = 0.0, dual_clip_fraction = 0.0;
  double importance_weight_mean = 0.0, importance_weight_min = 0.0, importance_weight_max = 0.0;
  double masked_fraction = 0.0, truncated_fraction = 0.0;  // icepop's zeroed, tis's capped weights
  // The generation policy against the learner's, means over trained tokens (LossStatistics):
  // exp(|old - gen|), the KL of each to the other, their Jensen-Shannon divergence, and the
  // policy's entropy estimated on the generation policy's samples.
  double token_mult_prob_error = 0.0, generation_kl = 0.0, policy_kl = 0.0, js_divergence = 0.0;
  double approx_entropy = 0.0;
  double grad_norm = 0.0, lr = 0.0, seconds = 0.0;  // grad_norm: the mean of the updates' (grpo.minibatches)
  bool skipped = false;         // Inf/NaN gradients (mixed precision): nothing was updated (in some update)
  int64_t updates = 1;          // optimizer updates the step took (grpo.minibatches x grpo.epochs)
  // More than one update: each update's loss and gradient norm, in order (else empty).
  std::vector<double> update_losses, update_grad_norms;
  // grpo.mtp_loss_weight > 0: each depth's mean cross-entropy on the response tokens (else empty).
  std::vector<double> mtp_losses;
  nlohmann::json to_json() const;
};

class GrpoLearner {
 public:
  // `config` validated; messages go to `console` on rank 0.
  GrpoLearner(const config::RunConfig& config, comm::Communicator& world, std::ostream& console);
  ~GrpoLearner();
  GrpoLearner(const GrpoLearner&) = delete;
  GrpoLearner& operator=(const GrpoLearner&) = delete;

  // One step on `groups` (collective; the same groups on every rank): grpo.minibatches optimizer
  // updates, each on its share of the samples, in order, grpo.epochs times over.
  LearnerStep step(const std::vector<RolloutGroup>& groups);
  // Writes a checkpoint of the current weights (train.checkpoint.async: in the background) and
  // returns its step directory (collective).
  std::string save();
  // The learner steps taken so far: the version of the current weights.
  int64_t weight_version() const;
  // Waits for background saves and every rank.
  void finish();
  train::Trainer& trainer();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace loom::rl
