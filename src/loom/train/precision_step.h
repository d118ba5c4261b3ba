#pragma once
// The training step's side of mixed precision (precision.recipe; the GEMMs' side is
// model/linear_precision.h). Every step:
//   1. begin_step(): the factor the gradient seed is multiplied by (fp16: the dynamic loss scale
//      S; 1 otherwise), a fresh per-step FP8 amax record, and on a device the weight cast cache's
//      scope opened (model/weight_cast_cache.h; step() closes it before anything else).
//   2. micro-batches and the data-parallel reduction as usual (parallel::DataParallelStep).
//   3. step(): on this rank's reduced gradients (whole or shards), fp16 unscales (x 1/S) and
//      checks for Inf/NaN in one pass, the other recipes only check. The flag and the FP8 amaxes
//      of the step are agreed over the world (one all-reduce max), so every rank decides the
//      same and keeps the same delayed-scaling history. Inf/NaN anywhere: the optimizer step is
//      skipped on every rank (gradients dropped, parameters and moments untouched) and fp16 halves
//      S; otherwise the optimizer steps and fp16 counts the clean step (S doubles after
//      precision.loss_scale_growth_interval of them). bf16 / fp32 / FP8 never scale, but a
//      non-finite gradient still skips the step (with a warning from the trainer) instead of
//      poisoning the weights.
// The optimizer's step number counts applied updates only (AdamW's bias correction), so a
// skipped update does not advance it and a trainer step of several updates (GRPO's minibatches)
// advances it by each; the learning-rate schedule follows the trainer's steps.
// state()/restore() carry the scaler, the skipped and applied update counts and FP8 amax
// histories through checkpoints.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/comm/communicator.h"
#include "loom/model/transformer.h"
#include "loom/precision/loss_scaler.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/config/run_config.h"

namespace loom::train {

struct PrecisionStepResult {
  double grad_norm = 0.0;       // global norm of the unscaled gradients (0 when skipped)
  bool skipped = false;         // Inf/NaN in some rank's gradients: nothing was updated
  float loss_scale = 1.0f;      // the scale this step's gradients were computed with
  float next_loss_scale = 1.0f;  // the scale of the next step
};

// Test seams, process-wide (every rank of the threads backend calls them with its world rank):
// corrupt_gradients runs after the reduction, before the check, and may write into this rank's
// reduced gradients; observe sees every rank's decision.
struct PrecisionStepHooks {
  std::function<void(int rank, int64_t step, const std::vector<std::span<float>>& grads)> corrupt_gradients;
  std::function<void(int rank, int64_t step, const PrecisionStepResult& result)> observe;
};
void set_precision_step_hooks(PrecisionStepHooks hooks);  // {} removes them

// The loss scaler a run's precision section asks for (disabled unless the recipe is fp16).
precision::DynamicLossScaler make_loss_scaler(const config::PrecisionConfig& config);

class PrecisionStep {
 public:
  // `world`: every rank of the run (the skip decision spans all of them). `same_layers`: the
  // ranks holding this rank's layers (tensor x data parallel: one pipeline stage), over which
  // the FP8 amaxes are agreed; null = the world (no pipeline).
  PrecisionStep(const config::PrecisionConfig& config, model::Transformer& model, parallel::DataParallelStep& optimizer,
                comm::Communicator& world, comm::Communicator* same_layers = nullptr);

  // Before the step's first micro-batch: the factor to multiply forward_backward's grad_scale by.
  float begin_step();
  // After the last micro-batch (collective over the world): instead of parallel::DataParallelStep::step.
  // `step`: the trainer's step the update belongs to (the test hooks see it).
  PrecisionStepResult step(double lr, int64_t step);

  bool loss_scaling() const { return scaler_.enabled(); }
  float loss_scale() const { return scaler_.scale(); }
  int64_t skipped_steps() const { return skipped_; }

  // {"recipe", "loss_scale", "clean_steps", "skipped_steps", "applied_updates", fp8 amax
  // histories}. restore() takes the update counts from any state (a state without
  // "applied_updates", written before a step could take several, applied one per step:
  // `steps_taken` less the skipped), the scaler and amax histories only from one written under the
  // same recipe (else they start fresh); null restores the counts alone. A key of the wrong type is
  // an Error naming `where` (the checkpoint's state.precision) and the key.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state, const std::string& where, int64_t steps_taken);
  // Collective over the pipeline group: state() with the FP8 histories of every stage's layers
  // (each stage holds its own), complete on pipeline rank 0; null elsewhere.
  nlohmann::json pipeline_state(comm::Communicator& pp) const;

 private:
  config::PrecisionRecipe recipe_;
  model::Transformer& model_;
  parallel::DataParallelStep& optimizer_;
  comm::Communicator& world_;
  comm::Communicator* same_layers_;
  precision::DynamicLossScaler scaler_;
  int64_t skipped_ = 0;
  int64_t applied_ = 0;  // updates applied: AdamW's step number of the last
};

}  // namespace loom::train
