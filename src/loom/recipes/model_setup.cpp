#include "loom/recipes/model_setup.h"

#include <filesystem>

#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"
#include "loom/recipes/sharded_training_state.h"

namespace loom::recipes {

runtime::ModelConfig resolve_model_config(const runtime::ModelConfig& model, const data::Tokenizer& tokenizer) {
  runtime::ModelConfig resolved = model;
  if (resolved.vocab_size == 0) resolved.vocab_size = tokenizer.vocab_size();
  check(resolved.vocab_size >= tokenizer.vocab_size(),
        "model.vocab_size " + std::to_string(resolved.vocab_size) + " is smaller than tokenizer '" + tokenizer.name() +
            "' needs (" + std::to_string(tokenizer.vocab_size()) + "); use 0 to take the tokenizer's");
  return resolved;
}

std::vector<optim::Segment> optimizer_segments(const model::ParameterStore& params) {
  std::vector<optim::Segment> segments;
  for (const model::Parameter& p : params.list()) segments.push_back({p.offset, p.numel, p.weight_decay});
  return segments;
}

std::string checkpoint_root(const runtime::RunConfig& config) {
  if (!config.checkpoint.dir.empty()) return config.checkpoint.dir;
  return (std::filesystem::path(config.run.dir) / "checkpoints").string();
}

nlohmann::json training_state(const TrainingProgress& progress, const runtime::RunConfig& config) {
  nlohmann::json state = {{"step", progress.step},
                          {"consumed_samples", progress.consumed_samples},
                          {"seed", config.train.seed},
                          {"rng", {{"generator", "philox4x32-10"}, {"seed", config.train.seed}}}};
  if (!progress.precision.is_null()) state["precision"] = progress.precision;
  return state;
}

ckpt::CheckpointSnapshot snapshot_training_state(const std::vector<ckpt::TensorRef>& tensors,
                                                 const TrainingProgress& progress, const runtime::RunConfig& config) {
  return ckpt::snapshot_checkpoint(progress.step, tensors, training_state(progress, config), runtime::to_yaml(config));
}

namespace {

// Reads this rank's slice of global tensor `name` (a parameter's or its optimizer state's).
void read_parameter_slice(const ckpt::LoadedCheckpoint& checkpoint, const std::string& name,
                          const model::Parameter& p, float* out) {
  check(checkpoint.has(name), "checkpoint " + checkpoint.path() + " has no tensor '" + name +
                                  "' (it was written for an incompatible model config)");
  const Shape stored = checkpoint.shape(name);
  check(stored == p.global_shape(), "checkpoint " + checkpoint.path() + ": tensor '" + name + "' has shape " +
                                        shape_string(stored) + " but the model's is " +
                                        shape_string(p.global_shape()) + " (incompatible model config)");
  checkpoint.read_slice(name, parameter_slice(p), out, DType::F32);
}

// Whether checkpoint parameter `name` belongs to a part of the model that another pipeline stage
// holds (that stage checks it against its own config).
bool held_by_another_stage(const model::Transformer& model, const std::string& name) {
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) {
    const size_t dot = name.find('.', layers.size());
    int layer = -1;
    try {
      layer = std::stoi(name.substr(layers.size(), dot - layers.size()));
    } catch (const std::exception&) {
      return false;
    }
    if (layer < 0 || layer >= model.config().layers) return false;
    for (const model::LayerRange& chunk : model.chunks()) {
      if (layer >= chunk.first && layer < chunk.last) return false;
    }
    return true;
  }
  if (name.rfind("model.embed_", 0) == 0) return !model.holds_embedding();
  if (name.rfind("model.norm.", 0) == 0 || name == "lm_head.weight") return !model.holds_head();
  return false;
}

}  // namespace

void load_parameters(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model) {
  model::ParameterStore& params = model.params();
  for (const model::Parameter& p : params.list()) {
    read_parameter_slice(checkpoint, p.name, p, params.values() + p.offset);
  }
  for (const std::string& name : checkpoint.parameter_names()) {
    check(params.find(name) >= 0 || held_by_another_stage(model, name), "checkpoint " + checkpoint.path() + " holds parameter '" + name +
                                      "' that this model config does not have (incompatible model config)");
  }
}

TrainingProgress load_training_checkpoint(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model,
                                          float* exp_avg, float* exp_avg_sq) {
  load_parameters(checkpoint, model);
  for (const model::Parameter& p : model.params().list()) {
    read_parameter_slice(checkpoint, ckpt::optimizer_state_name("exp_avg", p.name), p, exp_avg + p.offset);
    read_parameter_slice(checkpoint, ckpt::optimizer_state_name("exp_avg_sq", p.name), p, exp_avg_sq + p.offset);
  }
  TrainingProgress progress;
  progress.step = checkpoint.state().at("step").get<int64_t>();
  progress.consumed_samples = checkpoint.state().at("consumed_samples").get<int64_t>();
  if (checkpoint.state().contains("precision")) progress.precision = checkpoint.state().at("precision");
  return progress;
}

}  // namespace loom::recipes
