#pragma once
// The one trainer every recipe uses: it sets up one rank's share of a run (mesh, model, gradient
// synchronisation, pipeline, mixed precision), and then steps, evaluates, saves and restores.
// Recipes differ only in their batch sources (batch_source.h) and wiring (pretrain.cpp); the
// step loop with metrics, progress and checkpoint intervals is training_loop.h.
//
// The world is tp x cp x dp x pp (Megatron's rank order: tensor-parallel ranks adjacent, then
// context-, then data-parallel, pipeline slowest). The tensor-parallel ranks of a replica's stage
// hold their shards of its layers and run the same micro-batches; the context-parallel ranks
// each hold 2 of every sequence's 2 x cp chunks (gradients summed over dp x cp); the pipeline stages of a replica pass activations
// forward and gradients back in the schedule's order; the replicas run their slices of each
// global batch, gradients are summed over the data-parallel group, and the same optimizer step
// keeps them identical. The loss is the mean over the global count of trained tokens (weight 1)
// across micro-batches and replicas, agreed by a collective (world_agreements.h).
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/train/batch_source.h"
#include "loom/train/model_setup.h"
#include "loom/train/step_objective.h"

namespace loom::train {

// A step's mixture-of-experts routing, over every MoE layer and rank (present: the model has MoE layers).
struct MoeMetrics {
  bool present = false;
  double tokens_min = 0, tokens_mean = 0, tokens_max = 0;  // selections per (layer, expert) in the global batch
  double dropped_fraction = 0, aux_loss = 0, z_loss = 0;   // losses per micro-batch, summed over layers
  double layer_seconds = 0, exchange_seconds = 0;          // rank 0's time in MoE layers, in their all-to-alls
  int64_t all_to_all_bytes = 0;                            // rank 0's bytes sent to other expert-parallel ranks
};

// What one step did (the same on every rank, but for `reporter`-only fields noted). A step is
// one optimizer update over its global batch, or several over consecutive batches (GRPO's
// minibatches, Trainer::step's `update_batches`): the fields then sum or average the updates'.
struct StepResult {
  int64_t step = 0;
  int64_t global_batch = 0;   // sequences of this step (train.global_batch, or a ramp-up's; every update's)
  double loss = 0.0;          // mean token loss over the global batch's trained tokens (every update's)
  int64_t trained_tokens = 0; // targets with loss weight 1 in the global batch
  double lr = 0.0;
  double grad_norm = 0.0;     // several updates: the mean of the applied ones'
  double seconds = 0.0;
  bool skipped = false;       // Inf/NaN in the gradients: nothing was updated (several: in some update)
  float loss_scale = 1.0f, next_loss_scale = 1.0f;  // several: the first update's, the scale after the last
  // Each update's loss and gradient norm (0 where skipped), in order (one: the step's).
  std::vector<double> update_losses, update_grad_norms;
  MoeMetrics moe;
  // This rank's device (its allocator: the host's on the cpu, shared by the ranks of a process
  // there and on a shared GPU): the bytes allocated at the step's end and at most during it (the
  // run's first step: since the process or the memory check started).
  int64_t memory_allocated_bytes = 0, memory_peak_bytes = 0;
  // Seconds this rank waited for its tensor-parallel collectives (TensorParallel::take_wait_seconds).
  double tp_comm_wait_seconds = 0.0;
  std::vector<double> mtp_losses;  // by depth: multi-token prediction's mean token loss (model.mtp_depths)
  // Some rank was asked to stop (SIGINT/SIGTERM, or kStopForDuration of world_agreements.h): every
  // rank stops after this step.
  int stop_signal = 0;
};

// Multi-token prediction's losses by depth into a metrics record: mtp_loss_k and their mean
// mtp_loss (nothing when `losses` is empty).
void add_mtp_losses(const std::vector<double>& losses, nlohmann::json& record);

class Trainer {
 public:
  // `config` validated; `train` and `validation` (may be null) outlive the trainer. Messages go
  // to `console` on rank 0 only. Throws loom::Error on a layout that does not fit the world.
  Trainer(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
          const BatchSource* validation, std::ostream& console);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // train.resume: loads the latest checkpoint under the run's root, each rank its own slices
  // (collective); says so when there is none.
  // Without one to resume, train.init_from: the parameters of that checkpoint, a fresh optimizer.
  void restore();
  // The start-up report: model size, layout, memory, precision (rank 0).
  void describe();

  // One optimizer step over the next global batch (collective). `stop_signal`: the signal this
  // rank was asked to stop by, or kStopForDuration (0: none); the result says whether any rank was.
  StepResult step(int stop_signal);
  // The same over `global_batch` sequences in place of the schedule's, for a recipe whose steps
  // differ in rows (GRPO's packed rollouts): a multiple of batch_unit(), at most train.global_batch.
  StepResult step(int stop_signal, int64_t global_batch);
  // One step of several optimizer updates (GRPO's minibatches), update u over the next
  // `update_batches[u]` sequences of the source (each as `global_batch` above), all at the step's
  // learning rate (the schedule counts steps; the step's samples are every update's); AdamW's step
  // number counts the updates. The objective sees the later updates' batches first
  // (StepObjective::before_updates). Refused under optim.outer (DiLoCo counts its inner steps).
  StepResult step(int stop_signal, std::span<const int64_t> update_batches);
  // What every step's global batch is a multiple of: train.micro_batch x data-parallel ranks (x
  // parallel.pp under the interleaved schedule, whose micro-batches go in rounds of the stages).
  int64_t batch_unit() const;
  // Reinforcement learning: the objective of the next steps in place of cross-entropy (null:
  // cross-entropy again); StepResult::loss is then the mean of its token losses. Under context
  // parallelism it sees this rank's share of each sample (TokenBatch::keep_context_share).
  void set_objective(StepObjective* objective);
  // The log-probabilities of `batch`'s targets ([batch, seq], 0 where masked) under this rank's
  // parameters, or under `parameters` (a full copy of them, as parameter_copy gives) when not
  // null: forward only, micro-batch by micro-batch, on every replica. The values are those of
  // the ranks holding the head (the last pipeline stage); 0 elsewhere. Collective.
  std::vector<float> target_logprobs(const TokenBatch& batch, const Tensor* parameters);
  // A full copy of this rank's parameters (its tensor-parallel slices and stages), the current
  // ones or those of `checkpoint` (a root or step directory), on the parameters' device (so
  // target_logprobs swaps them in by device copies). Collective under ZeRO-3.
  Tensor parameter_copy(const std::string& checkpoint = "");
  // This rank's shards of the model parameters exactly as save() writes them (its tensor-parallel
  // slices, its stage's layers, its ZeRO part): over the world's ranks they tile every parameter
  // once. They point into the live state (on a GPU: a host copy of it): valid until the next step
  // or save.
  std::vector<ckpt::TensorRef> parameter_shards();
  // The context-parallel group: the ranks holding the other chunks of this rank's sequences (this
  // rank alone without context parallelism). An objective's sums over whole samples add over it.
  comm::Communicator& context_group();
  // Whether this rank contributes its replica's loss (and objective statistics) to the world's
  // sums: the first tensor-parallel rank of the last pipeline stage.
  bool holds_loss() const;

  // Mean token loss over the validation set's first train.eval_batches micro-batches, on rank 0
  // (nullopt elsewhere, and when there is no validation source). Collective.
  std::optional<double> evaluate();
  // The same over `data`'s first train.eval_batches micro-batches (the test set).
  std::optional<double> evaluate(const BatchSource& data);
  bool has_validation() const { return validation_ != nullptr; }
  // Writes a checkpoint of the current step (collective; train.checkpoint.async: in the
  // background). Returns its directory.
  std::string save();
  // Waits for background saves and for every rank; the heartbeat says whether the run finished.
  void finish();

  bool reporter() const;
  std::ostream& out() { return *out_; }
  const config::RunConfig& config() const;  // with the model's sizes resolved
  const TrainingProgress& progress() const;
  double flops_per_token() const;
  // The steps the run takes: train.steps, or the steps train.samples takes (batch_schedule.h).
  int64_t total_steps() const;
  // The extra fields of a step's metrics record (communication overlap, loss scaling).
  void add_metrics(const StepResult& result, nlohmann::json& record) const;
  // What the progress line adds to the standard statistics (MoE routing), or "".
  static std::string progress_extra(const StepResult& result);
  std::string peak_memory_report() const;
  // Planned memory (loom plan memory) against the first step's measured peak: call
  // start_memory_check just before the first step and memory_check_report after it.
  void start_memory_check();
  std::string memory_check_report() const;
  int64_t skipped_steps() const;
  bool loss_scaling() const;

 private:
  void check_resumable(const ckpt::LoadedCheckpoint& checkpoint);
  void initialize_from(const std::string& path);
  // step()'s work, inside its trace range.
  StepResult run_step(int stop_signal, std::span<const int64_t> update_batches);
  // One optimizer update of the step `result.step` at `result.lr` over the next `global_batch`
  // sequences: fills the rest of `result`.
  void run_update(int stop_signal, int64_t global_batch, int update, StepResult& result);
  // The objective's look at the later updates' batches (StepObjective::before_updates).
  void show_later_updates(std::span<const int64_t> update_batches);
  // The step's loss (and multi-token prediction's) agreed over the world, with any stop signal,
  // and the MoE layers' routing statistics.
  void agree_losses(StepResult& result, double local_loss_sum, int stop_signal);

  struct State;
  std::unique_ptr<State> state_;
  const BatchSource* validation_;
  std::ostringstream discard_;  // where a rank other than 0 writes (each rank its own)
  std::ostream* out_;
};

}  // namespace loom::train
