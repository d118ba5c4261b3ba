#pragma once
// Hooks around each unit of the model, for parallel wrappers that manage parameters and
// gradients outside the model: ZeRO-3 gathers a unit's parameters before it runs and releases
// them after; DDP starts reducing gradients as soon as a unit's backward has written them.
// Units, in forward order: 0 = embeddings, 1..layers = blocks, layers + 1 = final norm and
// output head. Backward visits them in reverse.
#include <vector>

namespace loom::model {

class ParameterHooks {
 public:
  virtual ~ParameterHooks() = default;
  virtual void before_forward(int /*unit*/) {}
  virtual void after_forward(int /*unit*/) {}
  // Before a unit's backward (and its recompute, with activation checkpointing).
  virtual void before_backward(int /*unit*/) {}
  // The unit's gradients for this micro-batch have been added.
  virtual void after_backward(int /*unit*/) {}
};

}  // namespace loom::model
