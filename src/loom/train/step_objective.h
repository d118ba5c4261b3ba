#pragma once
// An objective that replaces cross-entropy in Trainer::step (reinforcement learning: the GRPO
// loss of rl/grpo_objective.h). It is the head's per-token objective (model/token_objective.h)
// for the rows of this rank's share of the step's batch, and may first run forward-only passes
// of its own through the trainer (the reference policy's log-probabilities).
#include "loom/model/token_objective.h"
#include "loom/train/batch_source.h"

namespace loom::train {

class Trainer;

class StepObjective : public model::TokenObjective {
 public:
  // Called by Trainer::step on every rank with its share of the step's batch (masked, with the
  // source's per-target data) before the step's forward passes; `batch` stays valid through the
  // step. evaluate() then gets rows of `batch` (their offset in batch.targets names them).
  virtual void prepare(Trainer& trainer, const TokenBatch& batch) = 0;
};

}  // namespace loom::train
