#pragma once
// Dynamic loss scaling for fp16 (and FP8 with fp16-range gradients) training, as in automatic
// mixed precision: small gradients would flush to zero in fp16, so the loss (in practice the
// gradient seed of backward) is multiplied by a scale S, and the weight gradients by 1/S before
// the optimizer uses them.
//
// Each step: backward with the seed multiplied by scale(); then update() with whether this
// rank's gradients hold an Inf or NaN. The flag is agreed over the data-parallel group (all-reduce
// max), so every rank decides the same:
// - overflow: skip the optimizer step, S *= backoff (0.5), not below min_scale; the clean-step
//   counter restarts;
// - clean: count it; after growth_interval consecutive clean steps, S *= growth (2), capped at
//   max_scale, and the counter restarts.
// A disabled scaler (bf16 / fp32 recipes, whose range does not need it) keeps S = 1 and never
// skips, but still reports whether the gradients were finite.
#include <cstdint>

#include "loom/comm/communicator.h"

namespace loom::precision {

// Every rank of the group passes its flag; all get the OR (all-reduce max of 0/1).
bool agree_found_non_finite(bool local, comm::Communicator& group);

struct LossScalerConfig {
  bool enabled = true;
  float initial_scale = 65536.0f;  // 2^16, PyTorch's GradScaler default
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;  // consecutive clean steps before growing (PyTorch: 2000)
  float min_scale = 1.0f;
  float max_scale = 0x1p24f;
};

// What a checkpoint keeps; restoring it makes the scaler continue exactly.
struct LossScalerState {
  float scale = 1.0f;
  int64_t clean_steps = 0;  // consecutive steps without overflow since the last change of scale
};

struct LossScaleDecision {
  bool found_non_finite = false;  // on any rank of the group
  bool skip_step = false;         // the optimizer must not apply this step
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerConfig& config = {});
  static DynamicLossScaler disabled();

  float scale() const { return state_.scale; }
  float inverse_scale() const { return 1.0f / state_.scale; }
  bool enabled() const { return config_.enabled; }
  const LossScalerConfig& config() const { return config_; }

  // After backward: agree on local_non_finite over `group` (collective: every rank calls it),
  // then adjust the scale. Returns what every rank of the group decided.
  LossScaleDecision update(bool local_non_finite, comm::Communicator& group);
  // The same on one rank (no group).
  LossScaleDecision update(bool non_finite);

  LossScalerState state() const { return state_; }
  void restore(const LossScalerState& state);  // checks the scale is finite and > 0

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace loom::precision
