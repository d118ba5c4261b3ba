#include "loom/train/model_setup.h"

#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"
#include "loom/model/parameter_shapes.h"
#include "loom/train/sharded_training_state.h"

namespace loom::train {

config::ModelConfig resolve_model_config(const config::ModelConfig& model, const data::Tokenizer& tokenizer) {
  config::ModelConfig resolved = model;
  if (resolved.vocab_size == 0) resolved.vocab_size = tokenizer.vocab_size();
  LOOM_CHECK(resolved.vocab_size >= tokenizer.vocab_size(),
        "model.vocab_size " + std::to_string(resolved.vocab_size) + " is smaller than tokenizer '" + tokenizer.name() +
            "' needs (" + std::to_string(tokenizer.vocab_size()) + "); use 0 to take the tokenizer's");
  return resolved;
}

std::string checkpoint_root(const config::RunConfig& config) {
  if (!config.checkpoint.dir.empty()) return config.checkpoint.dir;
  return (std::filesystem::path(config.run.dir) / "checkpoints").string();
}

nlohmann::json training_state(const TrainingProgress& progress, const config::RunConfig& config) {
  nlohmann::json state = {{"step", progress.step},
                          {"consumed_samples", progress.consumed_samples},
                          {"seed", config.train.seed},
                          {"rng", {{"generator", "philox4x32-10"}, {"seed", config.train.seed}}}};
  if (!progress.precision.is_null()) state["precision"] = progress.precision;
  return state;
}

ckpt::CheckpointSnapshot snapshot_training_state(const std::vector<ckpt::TensorRef>& tensors,
                                                 const TrainingProgress& progress, const config::RunConfig& config) {
  return ckpt::snapshot_checkpoint(progress.step, tensors, training_state(progress, config), config::to_yaml(config));
}

namespace {

// Reads this rank's slice of global tensor `name` (a parameter's or its optimizer state's).
void read_parameter_slice(const ckpt::LoadedCheckpoint& checkpoint, const std::string& name,
                          const model::Parameter& p, float* out) {
  LOOM_CHECK(checkpoint.has(name), "checkpoint " + checkpoint.path() + " has no tensor '" + name +
                                  "' (it was written for an incompatible model config)");
  const Shape stored = checkpoint.shape(name);
  LOOM_CHECK(stored == p.global_shape(), "checkpoint " + checkpoint.path() + ": tensor '" + name + "' has shape " +
                                        shape_string(stored) + " but the model's is " +
                                        shape_string(p.global_shape()) + " (incompatible model config)");
  checkpoint.read_slice(name, parameter_slice(p), out, DType::F32);
}

// A count in the training state (step, consumed_samples): a non-negative integer.
int64_t state_count(const nlohmann::json& state, const char* key, const std::string& where) {
  const uint64_t count = ckpt::get_uint(state, key, where);
  LOOM_CHECK(count <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
             where + ": '" + key + "' is " + std::to_string(count) + ", beyond a signed 64-bit count");
  return static_cast<int64_t>(count);
}

}  // namespace

std::string training_state_where(const ckpt::LoadedCheckpoint& checkpoint) {
  // Appended piece by piece: GCC 12's -Wrestrict misreads "'" + string + "'..." as overlapping.
  std::string where = "'";
  where += (std::filesystem::path(checkpoint.path()) / ckpt::kManifestFile).string();
  where += "' state";
  return where;
}

std::string expert_bias_state_name(const model::MoeLayer& layer) {
  return std::string(ckpt::kStatePrefix) + "expert_bias." + layer.name() + ".gate";
}

void load_parameters(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model) {
  model::ParameterStore& params = model.params();
  // Read on the host: in place on the cpu, else into a staging copy uploaded once.
  const Device device = params.device();
  std::vector<float> staging(device.is_cpu() ? 0 : static_cast<size_t>(params.total()));
  float* values = device.is_cpu() ? params.values() : staging.data();
  for (const model::Parameter& p : params.list()) read_parameter_slice(checkpoint, p.name, p, values + p.offset);
  if (!device.is_cpu()) {
    params.commit_values();  // ZeRO-3 released its sections: a GPU does not page them back in
    copy_from_host(device, params.values(), staging.data(), params.total());
  }
  for (model::MoeLayer* layer : model.moe_layers()) {
    const std::string name = expert_bias_state_name(*layer);
    if (layer->has_expert_bias() && checkpoint.has(name))
      checkpoint.read(name, layer->expert_bias().data(), DType::F32, Shape{layer->experts()});
  }
  // Against the whole model's names, not this rank's: a pipeline stage holds only some layers.
  std::set<std::string> known;
  for (const model::ParameterShape& p : model::model_parameter_shapes(model.config())) known.insert(p.name);
  for (const std::string& name : checkpoint.parameter_names()) {
    LOOM_CHECK(known.count(name) != 0, "checkpoint " + checkpoint.path() + " holds parameter '" + name +
                                      "' that this model config does not have (incompatible model config)");
  }
}

void read_parameter_state(const ckpt::LoadedCheckpoint& checkpoint, const model::Transformer& model,
                          const std::function<std::string(const std::string&)>& name_of, float* out) {
  for (const model::Parameter& p : model.params().list()) read_parameter_slice(checkpoint, name_of(p.name), p, out + p.offset);
}

TrainingProgress load_training_checkpoint(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model,
                                          float* exp_avg, float* exp_avg_sq) {
  load_parameters(checkpoint, model);
  for (const model::Parameter& p : model.params().list()) {
    read_parameter_slice(checkpoint, ckpt::optimizer_state_name("exp_avg", p.name), p, exp_avg + p.offset);
    read_parameter_slice(checkpoint, ckpt::optimizer_state_name("exp_avg_sq", p.name), p, exp_avg_sq + p.offset);
  }
  TrainingProgress progress;
  const nlohmann::json& state = checkpoint.state();
  const std::string where = training_state_where(checkpoint);
  progress.step = state_count(state, "step", where);
  progress.consumed_samples = state_count(state, "consumed_samples", where);
  if (state.contains("precision")) progress.precision = state.at("precision");
  return progress;
}

}  // namespace loom::train
