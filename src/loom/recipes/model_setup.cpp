#include "loom/recipes/model_setup.h"

#include <filesystem>

#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"

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

ckpt::CheckpointSnapshot snapshot_training_state(const model::Transformer& model, const float* exp_avg,
                                                 const float* exp_avg_sq, const TrainingProgress& progress,
                                                 const runtime::RunConfig& config) {
  std::vector<ckpt::TensorRef> tensors;
  const model::ParameterStore& params = model.params();
  for (const model::Parameter& p : params.list()) {
    tensors.push_back({p.name, p.shape, DType::F32, params.values() + p.offset, {}});
    tensors.push_back({ckpt::optimizer_state_name("exp_avg", p.name), p.shape, DType::F32,
                       exp_avg + p.offset, {}});
    tensors.push_back({ckpt::optimizer_state_name("exp_avg_sq", p.name), p.shape, DType::F32,
                       exp_avg_sq + p.offset, {}});
  }
  nlohmann::json state = {{"step", progress.step},
                          {"consumed_samples", progress.consumed_samples},
                          {"seed", config.train.seed},
                          {"rng", {{"generator", "philox4x32-10"}, {"seed", config.train.seed}}}};
  return ckpt::snapshot_checkpoint(progress.step, tensors, state, runtime::to_yaml(config));
}

void load_parameters(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model) {
  model::ParameterStore& params = model.params();
  for (const model::Parameter& p : params.list()) {
    check(checkpoint.has(p.name), "checkpoint " + checkpoint.path() + " has no tensor '" + p.name +
                                      "' (it was written for an incompatible model config)");
    checkpoint.read(p.name, params.values() + p.offset, DType::F32, p.shape);
  }
  for (const std::string& name : checkpoint.parameter_names()) {
    check(params.find(name) >= 0, "checkpoint " + checkpoint.path() + " holds parameter '" + name +
                                      "' that this model config does not have (incompatible model config)");
  }
}

TrainingProgress load_training_checkpoint(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model,
                                          float* exp_avg, float* exp_avg_sq) {
  load_parameters(checkpoint, model);
  for (const model::Parameter& p : model.params().list()) {
    checkpoint.read(ckpt::optimizer_state_name("exp_avg", p.name), exp_avg + p.offset, DType::F32, p.shape);
    checkpoint.read(ckpt::optimizer_state_name("exp_avg_sq", p.name), exp_avg_sq + p.offset, DType::F32,
                    p.shape);
  }
  TrainingProgress progress;
  progress.step = checkpoint.state().at("step").get<int64_t>();
  progress.consumed_samples = checkpoint.state().at("consumed_samples").get<int64_t>();
  return progress;
}

}  // namespace loom::recipes
