#pragma once
// Building a model from a run's config, and moving its training state in and out of checkpoints.
#include <functional>
#include <memory>
#include <string>

#include "loom/ckpt/checkpoint.h"
#include "loom/data/tokenizer.h"
#include "loom/model/transformer.h"
#include "loom/optim/adamw.h"
#include "loom/config/run_config.h"

namespace loom::train {

// model.vocab_size 0 takes the tokenizer's; a smaller explicit one is an error.
config::ModelConfig resolve_model_config(const config::ModelConfig& model, const data::Tokenizer& tokenizer);

// What a checkpoint holds besides tensors.
struct TrainingProgress {
  int64_t step = 0;
  int64_t consumed_samples = 0;  // data position: global sample index of the next sample
  nlohmann::json precision;      // mixed precision: loss scaler, FP8 amax histories (precision_step.h)
};

// The checkpoint's trainer state object (step, data position, seed, precision state) that
// load_training_checkpoint reads back.
nlohmann::json training_state(const TrainingProgress& progress, const config::RunConfig& config);

// Copies the training state (parameters and optimizer moments as global tensors or shards of
// them, see sharded_training_state.h), progress and config into a snapshot ready to be written
// (synchronously, or by ckpt::AsyncCheckpointWriter while training continues).
ckpt::CheckpointSnapshot snapshot_training_state(const std::vector<ckpt::TensorRef>& tensors,
                                                 const TrainingProgress& progress, const config::RunConfig& config);

// Where the checkpoint's trainer state is, for errors: "'<step dir>/manifest.json' state".
std::string training_state_where(const ckpt::LoadedCheckpoint& checkpoint);

// Loads parameters and optimizer moments, each rank its own slice of every global tensor (so any
// tensor-parallel layout reads any other's checkpoint); a tensor whose global shape differs from
// the model's is an Error naming the tensor and both shapes, a state without its step or
// consumed_samples as non-negative integers one naming the manifest and the key.
TrainingProgress load_training_checkpoint(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model,
                                          float* exp_avg, float* exp_avg_sq);

// Loads only the parameters (generation, evaluation), and the MoE routers' aux-loss-free expert
// biases when the checkpoint holds them (they pick the experts).
void load_parameters(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model);
// Where a router's aux-loss-free bias lives in a checkpoint (a state tensor, not a parameter).
std::string expert_bias_state_name(const model::MoeLayer& layer);
// For every parameter p of `model`, this rank's slice of the global tensor name_of(p.name) into
// out + p.offset (state kept per parameter under other names, e.g. DiLoCo's outer state).
void read_parameter_state(const ckpt::LoadedCheckpoint& checkpoint, const model::Transformer& model,
                          const std::function<std::string(const std::string&)>& name_of, float* out);

// The checkpoint root of a run: checkpoint.dir, or run.dir/checkpoints.
std::string checkpoint_root(const config::RunConfig& config);

}  // namespace loom::train
