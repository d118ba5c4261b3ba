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
  // Called by Trainer::step on every rank with its share of an update's batch (masked, with the
  // source's per-target data) before the update's forward passes; `batch` stays valid through the
  // update. evaluate() then gets rows of `batch` (their offset in batch.targets names them).
  // `update` counts the step's optimizer updates from 0 (a step of several: GRPO's minibatches).
  virtual void prepare(Trainer& trainer, const TokenBatch& batch, int update) = 0;
  // A step of several updates calls this first, under the parameters the step starts from, with
  // this rank's share of each later update's batch in turn (update 1, 2, ...; valid during the
  // call only): what the objective needs of those parameters (GRPO's old log-probabilities).
  virtual void before_updates(Trainer& /*trainer*/, const TokenBatch& /*batch*/, int /*update*/) {}
};

}  // namespace loom::train
