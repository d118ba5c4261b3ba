#include "loom/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/error.h"

namespace loom::precision {

bool agree_found_non_finite(bool local, comm::Communicator& group) {
  float flag = local ? 1.0f : 0.0f;
  group.all_reduce(&flag, 1, DType::F32, comm::ReduceOp::Max);
  return flag != 0.0f;
}

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& config) : config_(config) {
  if (!config_.enabled) {
    state_.scale = 1.0f;
    return;
  }
  LOOM_CHECK(config_.initial_scale > 0.0f && std::isfinite(config_.initial_scale),
        "loss scaler: initial_scale must be finite and > 0, got " + std::to_string(config_.initial_scale));
  LOOM_CHECK(config_.growth_factor >= 1.0f, "loss scaler: growth_factor must be >= 1, got " +
                                           std::to_string(config_.growth_factor));
  LOOM_CHECK(config_.backoff_factor > 0.0f && config_.backoff_factor < 1.0f,
        "loss scaler: backoff_factor must be in (0, 1), got " + std::to_string(config_.backoff_factor));
  LOOM_CHECK(config_.growth_interval >= 1, "loss scaler: growth_interval must be >= 1, got " +
                                          std::to_string(config_.growth_interval));
  LOOM_CHECK(config_.min_scale > 0.0f && config_.min_scale <= config_.max_scale && std::isfinite(config_.max_scale),
        "loss scaler: need 0 < min_scale <= max_scale < Inf, got " + std::to_string(config_.min_scale) + " and " +
            std::to_string(config_.max_scale));
  state_.scale = std::clamp(config_.initial_scale, config_.min_scale, config_.max_scale);
}

DynamicLossScaler DynamicLossScaler::disabled() {
  LossScalerConfig config;
  config.enabled = false;
  return DynamicLossScaler(config);
}

LossScaleDecision DynamicLossScaler::update(bool local_non_finite, comm::Communicator& group) {
  return update(agree_found_non_finite(local_non_finite, group));
}

LossScaleDecision DynamicLossScaler::update(bool non_finite) {
  LossScaleDecision decision{non_finite, false};
  if (!config_.enabled) return decision;
  if (non_finite) {
    decision.skip_step = true;
    state_.scale = std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    state_.clean_steps = 0;
  } else if (++state_.clean_steps >= config_.growth_interval) {
    state_.scale = std::min(state_.scale * config_.growth_factor, config_.max_scale);
    state_.clean_steps = 0;
  }
  return decision;
}

void DynamicLossScaler::restore(const LossScalerState& state) {
  LOOM_CHECK(state.scale > 0.0f && std::isfinite(state.scale),
        "loss scaler: restored scale must be finite and > 0, got " + std::to_string(state.scale));
  LOOM_CHECK(state.clean_steps >= 0, "loss scaler: restored clean-step count is negative");
  LOOM_CHECK(config_.enabled || state.scale == 1.0f, "loss scaler: a disabled scaler keeps scale 1, got " +
                                                    std::to_string(state.scale));
  state_ = state;
}

}  // namespace loom::precision
