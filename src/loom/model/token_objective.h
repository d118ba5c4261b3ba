#pragma once
// A per-token training objective on the head's log-probabilities, in place of cross-entropy
// (reinforcement learning: rl/grpo_objective.h). The head computes each row's log-probability of
// its target (vocabulary-parallel: every tensor-parallel rank gets the same values), asks the
// objective for each row's loss and d(loss)/d(logp), and writes the logits' gradient
//   d(loss)/d(logits_r) = g_r (onehot(target_r) - softmax_r)
// times the pass's grad_scale. Cross-entropy is the objective loss = -logp, g = -1.
#include <cstdint>

namespace loom::model {

class TokenObjective {
 public:
  virtual ~TokenObjective() = default;
  // `rows` rows of one micro-batch: `targets` is the pointer the caller passed for them (into
  // the batch it made the objective for: its offset there names the rows), logp[r] the
  // log-probability of targets[r] (any value where the target is kIgnoreIndex). Writes
  // gradient[r] = d(loss_r)/d(logp[r]) (0 for ignored rows) and returns the sum of the rows'
  // losses. Called once per micro-batch forward on the ranks holding the head.
  virtual double evaluate(const int32_t* targets, const float* logp, int64_t rows, float* gradient) = 0;
  // The weight of the multi-token prediction depths' loss beside the objective (0: the depths do
  // not run). Each depth's cross-entropy on the targets k ahead then trains the depths alone: its
  // gradient reaches neither the main model's output, nor the embedding the depths read, nor the
  // shared head's weight: every gradient of the main model's parameters is what it is without it
  // (the global norm that clipping reads counts the depths' too).
  virtual double depth_loss_weight() const { return 0.0; }
};

}  // namespace loom::model
