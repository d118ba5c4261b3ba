// The trainer's checkpoints: saving this rank's shards, resuming from them, starting from another
// run's parameters.
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "loom/ckpt/checkpoint.h"
#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/train/batch_schedule.h"
#include "loom/train/config_changes.h"
#include "loom/train/sharded_training_state.h"
#include "loom/train/trainer_state.h"
#include "loom/train/world_agreements.h"

namespace loom::train {

// A model change cannot resume; changed settings are listed (allowed, never silent).
void Trainer::check_resumable(const ckpt::LoadedCheckpoint& checkpoint) {
  train::check_resumable(checkpoint.config_yaml(), checkpoint.path(), state_->run, out());
}

void Trainer::initialize_from(const std::string& path) {
  State& s = *state_;
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(path);
  load_parameters(checkpoint, *s.model);
  // A fresh optimizer: zero moments, and the master weights taken from the loaded parameters.
  const std::vector<float> zeros(s.model->params().total(), 0.0f);
  s.optimizer->load_moments(zeros.data(), zeros.data());
  out() << "train.init_from: parameters of " << checkpoint.path() << " (fresh optimizer, step 0)\n";
}

void Trainer::restore() {
  State& s = *state_;
  const std::string root = checkpoint_root(s.run);
  const bool resumable = s.run.train.resume && std::filesystem::exists(std::filesystem::path(root) / "latest");
  if (!resumable && !s.run.train.init_from.empty()) initialize_from(s.run.train.init_from);
  if (!s.run.train.resume) return;
  if (!resumable) {
    out() << "train.resume: no checkpoint under " << root << ", starting from step 0\n";
    return;
  }
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
  // Full moments read from the checkpoint; each rank keeps its shards.
  std::vector<float> exp_avg(s.model->params().total(), 0.0f), exp_avg_sq(exp_avg.size(), 0.0f);
  s.progress = load_training_checkpoint(checkpoint, *s.model, exp_avg.data(), exp_avg_sq.data());
  if (s.outer) s.outer->restore(checkpoint, *s.model, exp_avg.data(), exp_avg_sq.data());
  check_resumable(checkpoint);  // after the shapes: a shape mismatch names its tensor
  for (model::MoeLayer* layer : s.model->moe_layers()) {
    const std::string name = expert_bias_state_name(*layer);
    if (layer->has_expert_bias() && checkpoint.has(name)) {
      checkpoint.read(name, layer->expert_bias().data(), DType::F32, Shape{layer->experts()});
    }
  }
  s.precision->restore(s.progress.precision, training_state_where(checkpoint) + ".precision", s.progress.step);
  s.optimizer->load_moments(exp_avg.data(), exp_avg_sq.data());
  out() << "resumed from " << checkpoint.path() << " at step " << s.progress.step << "\n";
  if (s.run.train.skip_train) return;  // evaluated where it is, however long the run
  const std::string length = run_length_key(s.run.train);
  const std::string key = s.run.train.samples > 0 ? "train.samples" : "train.steps";
  LOOM_CHECK(s.progress.step <= s.total_steps,
             length + " is behind the checkpoint " + checkpoint.path() + " at step " +
                 std::to_string(s.progress.step) + ": raise " + key + " to train on, or start a new run in another "
                 "run.dir");
  if (s.progress.step == s.total_steps) {
    out() << "the run is already complete: the checkpoint is at step " << s.progress.step << ", the last of "
          << length << "; nothing to train (raise " << key << " to continue)\n";
  }
}

std::vector<ckpt::TensorRef> Trainer::parameter_shards() {
  State& s = *state_;
  std::vector<parallel::OwnedRange> values = s.optimizer->checkpoint_ranges();
  for (parallel::OwnedRange& r : values) r.exp_avg = r.exp_avg_sq = nullptr;  // a GPU copies the values only
  const auto owned = host_ranges(s.model->params().device(), std::move(values), s.saved_from_device);
  std::vector<ckpt::TensorRef> refs = owned_training_state(*s.model, owned);
  if (s.outer) refs = s.outer->checkpoint_tensors(*s.model, std::move(refs), owned);
  std::erase_if(refs, [](const ckpt::TensorRef& r) { return !ckpt::is_model_parameter(r.name); });
  return refs;
}

std::string Trainer::save() {
  State& s = *state_;
  const int64_t step = s.progress.step;
  s.heartbeat.phase("checkpoint", step);
  trace::Range range("checkpoint save");
  const std::string root = checkpoint_root(s.run);
  // Every rank writes the shards it owns (its tensor-parallel slices, its stage's layers, its
  // part of the data-parallel state) into one shared directory; rank 0 publishes the
  // checkpoint once every rank's part is there.
  const std::vector<parallel::OwnedRange> owned = host_ranges(s.model->params().device(),
                                                              s.optimizer->checkpoint_ranges(), s.saved_from_device);
  std::vector<ckpt::TensorRef> refs = owned_training_state(*s.model, owned);
  if (s.outer) refs = s.outer->checkpoint_tensors(*s.model, std::move(refs), owned);
  if (s.mesh.dp_rank() == 0 && s.mesh.tp_rank() == 0 && s.mesh.cp_rank() == 0) {
    for (const model::MoeLayer* layer : s.model->moe_layers()) {  // the same on every rank: one writes it
      if (!layer->has_expert_bias()) continue;
      const Shape shape{layer->experts()};
      refs.push_back({expert_bias_state_name(*layer), shape, DType::F32, layer->expert_bias().data(),
                      ckpt::full_slice(shape)});
    }
  }
  if (s.mesh.layout().shape.pp > 1) {
    if (s.mesh.dp_rank() == 0 && s.mesh.tp_rank() == 0) {
      s.progress.precision = s.precision->pipeline_state(s.mesh.pp());  // every stage's FP8 histories
    }
  } else {
    s.progress.precision = s.precision->state();
  }
  // The state and config travel in rank 0's part: it writes the manifest.
  ckpt::CheckpointSnapshot snapshot = ckpt::snapshot_checkpoint(
      step, refs, reporter() ? training_state(s.progress, s.run) : nlohmann::json::object(),
      reporter() ? config::to_yaml(s.run) : std::string(), ckpt::ManifestScope::RankPart,
      s.async_writer.take_arena());  // waits only for a save still in flight
  const int64_t token = agree_save_token(s.world, static_cast<int64_t>(::getpid()));
  const ckpt::SaveRank who{s.world.rank(), s.world.size(), token,
                           std::chrono::milliseconds(static_cast<int64_t>(s.run.runtime.timeout_s * 1000.0))};
  if (s.run.checkpoint.async) {
    s.async_writer.save(root, std::move(snapshot), s.run.checkpoint.keep, who);  // the disk works while we train
  } else {
    ckpt::write_snapshot(root, snapshot, s.run.checkpoint.keep, who);
  }
  if (reporter()) s.faults.after_checkpoint(step, root, [&] { s.async_writer.wait(); });
  return (std::filesystem::path(root) / ckpt::step_dir_name(step)).string();
}

}  // namespace loom::train
