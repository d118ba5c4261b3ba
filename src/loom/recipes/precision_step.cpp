#include "loom/recipes/precision_step.h"

#include <cmath>
#include <mutex>

#include "loom/core/error.h"

namespace loom::recipes {

namespace {
std::mutex g_hooks_mutex;
PrecisionStepHooks g_hooks;

PrecisionStepHooks current_hooks() {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  return g_hooks;
}
}  // namespace

void set_precision_step_hooks(PrecisionStepHooks hooks) {
  std::lock_guard<std::mutex> lock(g_hooks_mutex);
  g_hooks = std::move(hooks);
}

precision::DynamicLossScaler make_loss_scaler(const runtime::PrecisionConfig& config) {
  if (config.recipe != "fp16") return precision::DynamicLossScaler::disabled();
  precision::LossScalerConfig scaler;
  scaler.initial_scale = static_cast<float>(config.loss_scale_initial);
  scaler.growth_interval = config.loss_scale_growth_interval;
  scaler.min_scale = static_cast<float>(config.loss_scale_min);
  scaler.max_scale = std::max(scaler.max_scale, scaler.min_scale);
  return precision::DynamicLossScaler(scaler);
}

PrecisionStep::PrecisionStep(const runtime::PrecisionConfig& config, model::Transformer& model,
                             DataParallelStep& optimizer, comm::Communicator& world)
    : recipe_(config.recipe), model_(model), optimizer_(optimizer), world_(world), scaler_(make_loss_scaler(config)) {}

float PrecisionStep::begin_step() {
  model_.precision().clear_pending();  // amaxes of evaluation forwards do not count
  return scaler_.scale();
}

PrecisionStepResult PrecisionStep::step(double lr, int64_t step) {
  PrecisionStepResult result;
  result.loss_scale = scaler_.scale();
  const PrecisionStepHooks hooks = current_hooks();
  const std::vector<std::span<float>> grads = optimizer_.reduced_gradients();
  if (hooks.corrupt_gradients) hooks.corrupt_gradients(world_.rank(), step, grads);
  bool local = false;
  if (scaler_.enabled()) {
    const float inverse = scaler_.inverse_scale();  // a power of two: exact
    for (const std::span<float>& g : grads) local |= precision::unscale_and_check(g.data(), static_cast<int64_t>(g.size()), inverse);
  } else {
    for (const std::span<float>& g : grads) {
      if (local) break;
      local = precision::found_non_finite(g.data(), static_cast<int64_t>(g.size()));
    }
  }
  // One all-reduce max over the world: the non-finite flag, then this step's FP8 amaxes (a
  // non-finite amax as +Inf, which max keeps deterministically and the history ignores).
  std::vector<float> agreed = {local ? 1.0f : 0.0f};
  for (float a : model_.precision().pending_amaxes()) agreed.push_back(std::isfinite(a) ? a : INFINITY);
  if (world_.size() > 1) {
    world_.all_reduce(agreed.data(), static_cast<int64_t>(agreed.size()), DType::F32, comm::ReduceOp::Max);
  }
  const bool found = agreed[0] != 0.0f;
  model_.precision().commit_amaxes(std::vector<float>(agreed.begin() + 1, agreed.end()));
  scaler_.update(found);
  if (found) {
    optimizer_.skip_step();
    result.skipped = true;
    ++skipped_;
  } else {
    // AdamW's step number counts the updates applied (bias correction), not the iterations.
    result.grad_norm = optimizer_.step(lr, step - skipped_);
  }
  result.next_loss_scale = scaler_.scale();
  if (hooks.observe) hooks.observe(world_.rank(), step, result);
  return result;
}

nlohmann::json PrecisionStep::state() const {
  nlohmann::json state = {{"recipe", recipe_},
                          {"loss_scale", scaler_.scale()},
                          {"clean_steps", scaler_.state().clean_steps},
                          {"skipped_steps", skipped_}};
  nlohmann::json linear = model_.precision().state();
  if (!linear.is_null()) state["linear"] = linear;
  return state;
}

void PrecisionStep::restore(const nlohmann::json& state) {
  if (state.is_null()) return;
  skipped_ = state.value("skipped_steps", int64_t{0});  // the optimizer's update count, whatever the recipe
  if (state.value("recipe", std::string()) != recipe_) return;
  precision::LossScalerState scaler;
  scaler.scale = state.at("loss_scale").get<float>();
  scaler.clean_steps = state.at("clean_steps").get<int64_t>();
  scaler_.restore(scaler);
  if (state.contains("linear")) model_.precision().restore(state.at("linear"));
}

}  // namespace loom::recipes
