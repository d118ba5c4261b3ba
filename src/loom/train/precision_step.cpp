#include "loom/train/precision_step.h"

#include <cmath>
#include <mutex>

#include "loom/ckpt/manifest.h"
#include "loom/comm/gather_text.h"
#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/train/world_agreements.h"

namespace loom::train {

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

precision::DynamicLossScaler make_loss_scaler(const config::PrecisionConfig& config) {
  if (config.recipe != config::PrecisionRecipe::Fp16) return precision::DynamicLossScaler::disabled();
  precision::LossScalerConfig scaler;
  scaler.initial_scale = static_cast<float>(config.loss_scale_initial);
  scaler.growth_interval = config.loss_scale_growth_interval;
  scaler.min_scale = static_cast<float>(config.loss_scale_min);
  scaler.max_scale = std::max(scaler.max_scale, scaler.min_scale);
  return precision::DynamicLossScaler(scaler);
}

PrecisionStep::PrecisionStep(const config::PrecisionConfig& config, model::Transformer& model,
                             parallel::DataParallelStep& optimizer, comm::Communicator& world, comm::Communicator* same_layers)
    : recipe_(config.recipe), model_(model), optimizer_(optimizer), world_(world),
      same_layers_(same_layers != nullptr && same_layers != &world ? same_layers : nullptr),
      scaler_(make_loss_scaler(config)) {}

float PrecisionStep::begin_step() {
  model_.precision().clear_pending();  // amaxes of evaluation forwards do not count
  // The weights stay as they are until step(): their casts are made once for all micro-batches.
  model::WeightCastCache& casts = model_.precision().weight_casts();
  casts.open();
  // The optimizer's bf16 copy of the values, where it keeps one current: no bf16 weight is cast.
  if (const void* copy = optimizer_.bf16_values())
    casts.use_bf16_copy(model_.params().values(), model_.params().total(), copy);
  return scaler_.scale();
}

PrecisionStepResult PrecisionStep::step(double lr, int64_t step) {
  model_.precision().weight_casts().close();  // before anything writes a weight
  PrecisionStepResult result;
  result.loss_scale = scaler_.scale();
  const PrecisionStepHooks hooks = current_hooks();
  trace::Range reduction_range("gradient reduction");  // what the backward's reductions left to wait for
  const std::vector<std::span<float>> grads = optimizer_.reduced_gradients();
  reduction_range.end();
  if (hooks.corrupt_gradients) hooks.corrupt_gradients(world_.rank(), step, grads);
  if (scaler_.enabled()) {
    const Device device = optimizer_.reduced_gradients_on_host() ? Device::cpu() : model_.params().device();
    const float inverse = scaler_.inverse_scale();  // a power of two: exact, and Inf or NaN stays so
    for (const std::span<float>& g : grads) {
      kernels::scale_in_place(device, g.data(), static_cast<int64_t>(g.size()), inverse);
    }
  }
  // The norm is the check: its squares are summed in fp64, where no finite gradient overflows,
  // so it is Inf or NaN exactly when a gradient it counts is (a copy another rank counts is
  // checked there), and the step reads the gradients once for both.
  trace::Range norm_range("gradient norm");
  const double norm = optimizer_.gradient_norm();
  norm_range.end();
  trace::Range agreement_range("non-finite and amax agreement");
  // An all-reduce max: the non-finite flag over the world (the norm is the same on every rank of
  // the model, but a rank whose gradients were corrupted after the reduction must not update
  // alone), this step's FP8 amaxes (a non-finite amax as +Inf, which max keeps deterministically
  // and the history ignores) over the ranks holding the same layers. Without a pipeline those are
  // the world: one all-reduce.
  std::vector<float> amaxes;
  for (float a : model_.precision().pending_amaxes()) amaxes.push_back(std::isfinite(a) ? a : INFINITY);
  const bool found = agree_non_finite_and_amaxes(world_, same_layers_, !std::isfinite(norm), amaxes);
  model_.precision().commit_amaxes(amaxes);
  scaler_.update(found);
  agreement_range.end();
  trace::Range update_range("update");
  if (found) {
    optimizer_.skip_step();
    result.skipped = true;
    ++skipped_;
  } else {
    // AdamW's step number counts the updates applied (bias correction), not the iterations.
    optimizer_.update(lr, ++applied_, norm);
    result.grad_norm = norm;
  }
  result.next_loss_scale = scaler_.scale();
  if (hooks.observe) hooks.observe(world_.rank(), step, result);
  return result;
}

nlohmann::json PrecisionStep::state() const {
  nlohmann::json state = {{"recipe", config::to_string(recipe_)},
                          {"loss_scale", scaler_.scale()},
                          {"clean_steps", scaler_.state().clean_steps},
                          {"skipped_steps", skipped_},
                          {"applied_updates", applied_}};
  nlohmann::json linear = model_.precision().state();
  if (!linear.is_null()) state["linear"] = linear;
  return state;
}

nlohmann::json PrecisionStep::pipeline_state(comm::Communicator& pp) const {
  nlohmann::json mine = state();
  const std::vector<std::string> stages = comm::gather_text(mine.dump(), pp, 0);
  if (pp.rank() != 0) return nullptr;
  for (const std::string& text : stages) {
    const nlohmann::json stage = nlohmann::json::parse(text);
    if (!stage.contains("linear")) continue;
    for (const auto& [name, histories] : stage.at("linear").at("fp8_delayed").items()) {
      mine["linear"]["fp8_delayed"][name] = histories;
    }
  }
  return mine;
}

void PrecisionStep::restore(const nlohmann::json& state, const std::string& where, int64_t steps_taken) {
  skipped_ = 0;
  applied_ = steps_taken;
  if (state.is_null()) return;
  LOOM_CHECK(state.is_object(), where + ": expected a JSON object (the precision recipe's state), got a JSON " +
                                    state.type_name());
  // The optimizer's update counts, whatever the recipe.
  if (state.contains("skipped_steps")) skipped_ = static_cast<int64_t>(ckpt::get_uint(state, "skipped_steps", where));
  applied_ = state.contains("applied_updates") ? static_cast<int64_t>(ckpt::get_uint(state, "applied_updates", where))
                                               : steps_taken - skipped_;
  if (!state.contains("recipe") || ckpt::get_string(state, "recipe", where) != config::to_string(recipe_)) return;
  precision::LossScalerState scaler;
  const nlohmann::json& scale = ckpt::member(state, "loss_scale", where);
  LOOM_CHECK(scale.is_number(), where + ": 'loss_scale' must be a number");
  scaler.scale = scale.get<float>();
  scaler.clean_steps = static_cast<int64_t>(ckpt::get_uint(state, "clean_steps", where));
  scaler_.restore(scaler);
  if (!state.contains("linear")) return;
  try {
    model_.precision().restore(state.at("linear"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": 'linear' is not the FP8 scaling state loom writes ({\"fp8_delayed\": {GEMM: [{amax_history, "
                "next, scale} x 3]}}): " + e.what());
  }
}

}  // namespace loom::train
