#pragma once
// How the gradients of the data-parallel ranks are combined and the optimizer steps, by ZeRO
// stage (parallel.zero):
//   0: every rank holds everything; buckets are all-reduced during the last micro-batch's
//      backward (DDP), then each rank runs the same AdamW step.
//   1: buckets are reduce-scattered during the last backward; master weights and moments exist
//      for this rank's shard only; updated shards are all-gathered into every rank's parameters.
//   2: as 1, with a reduce-scatter after every micro-batch so only the shard of the reduced
//      gradient is kept across micro-batches (the full buffer holds one micro-batch at a time).
//   3: parameters sharded too (parallel/zero3.h): each unit's parameters are gathered around
//      its forward and backward and released after; gradients are reduce-scattered per unit.
//      Outside a micro-batch the model's values buffer holds nothing: gather_full_parameters()
//      before reading it (checkpoints, evaluation), release_full_parameters() after.
// With one rank and zero 0 nothing is communicated.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/model/transformer.h"
#include "loom/optim/adamw.h"
#include "loom/parallel/data/compact_parameters.h"
#include "loom/parallel/data/distributed_optimizer.h"
#include "loom/parallel/data/grad_buckets.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/parallel/data/zero3.h"
#include "loom/parallel/data/parameter_ranges.h"
#include "loom/config/run_config.h"

namespace loom::parallel {

class DataParallelStep : private model::ParameterHooks {
 public:
  // `dp`: the ranks holding the same shard of the model (the model's tensor-parallel group, if
  // any, is taken from the model: the gradient norm is summed over it too). `pp`: the pipeline
  // group when the model is a pipeline stage (the norm sums over the stages; ZeRO 0-2 only).
  DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                   comm::Communicator* pp = nullptr);

  // Pipeline stages with tied embeddings: the first stage's embedding and the last stage's copy
  // (`param`) have their gradients summed over `embedding` (the two stages) when a reduction
  // round ends, before the data-parallel reduction, so both copies take the same update.
  void set_tied_embedding(comm::Communicator* embedding, int param);
  // Pipeline schedules that interleave model chunks spread a micro-batch's backward over time, so
  // zero 2 reduces once per step as zero 1 does (the gradient buffer lives through the step).
  void reduce_once_per_step() { once_per_step_ = true; }
  ~DataParallelStep() override;

  // Before each micro-batch's forward_backward (last = the step's final micro-batch).
  void begin_micro_batch(bool last);
  // After each micro-batch's forward_backward.
  void end_micro_batch(bool last);
  // Clip by global norm and update; parameters are identical on every rank afterwards, and the
  // gradient buffer is zeroed for the next step. Returns the global norm before clipping.
  double step(double lr, int64_t step);
  // After the last micro-batch, before step(): the reduced gradients this rank holds (the whole
  // buffer at zero 0, its shards at 1-3), for mixed precision (train/precision_step.h) to
  // unscale and check for Inf/NaN. skip_step() replaces step() when a step is skipped.
  std::vector<std::span<float>> reduced_gradients();
  void skip_step();

  // Restores the moments from full flat buffers (each rank keeps its shards); parameters must
  // already hold the checkpoint's values (zero 3 re-shards them from there).
  void load_moments(const float* exp_avg, const float* exp_avg_sq);

  // The flat ranges of the parameter buffer whose values (the fp32 master weights) and moments
  // this rank writes to a checkpoint: disjoint over the data-parallel ranks, together the whole
  // buffer (zero 1-3: the shards it owns; zero 0: an even split of the replicated state).
  std::vector<OwnedRange> checkpoint_ranges() const;

  // Collective. The model's values buffer holds the full parameters until release (zero 3; the
  // other stages always hold them, and these do nothing).
  void gather_full_parameters();
  void release_full_parameters();

  // Fraction of the gradient communication hidden behind backward, over all steps so far.
  double hidden_fraction() const;
  // Per-rank bytes by category: parameters, gradients, master weights, moments, comm buffers.
  std::string memory_report() const;
  parallel::MemoryBytes memory_bytes() const;
  // The measured peak so far (zero 3: resident parameters and gradients per rank) and the
  // process's peak RSS; for the report after the first step.
  std::string peak_memory_report() const;

 private:
  void before_forward(int unit) override;
  void after_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

  bool rounds_per_micro_batch() const { return zero_ == 2 && !once_per_step_; }
  // Hooks stay installed between micro-batches when parameters are compact (they must be
  // widened around every unit, evaluation included).
  void install_hooks();
  // Zeroes the full gradient buffer for the next step or round; ZeRO-2 releases its pages.
  void clear_gradients();
  void reduce_tied_embedding();

  comm::Communicator& dp_;
  model::Transformer& model_;
  int zero_;
  DType param_dtype_ = DType::F32;  // what the model's parameters are rounded to
  std::vector<float> master_;       // zero 0 with param_dtype_ != F32: the fp32 master weights
  std::vector<std::byte> compact_store_;  // zero 0 with param_dtype_ != F32: the compact parameters
  std::unique_ptr<parallel::CompactParameters> compact_;  // zero 0-2 with param_dtype_ != F32
  bool reducing_ = false;  // this micro-batch's backward marks gradients ready
  bool once_per_step_ = false;
  comm::Communicator* tied_group_ = nullptr;  // first and last pipeline stage
  int tied_param_ = -1;
  std::vector<std::vector<int>> ready_by_unit_;  // parameters whose gradient completes in a unit
  std::vector<comm::Communicator*> norm_groups_;  // beyond dp: the tensor-parallel group
  std::vector<parallel::FlatRange> norm_excluded_;  // copies another tensor-parallel rank counts
  std::unique_ptr<optim::AdamW> adamw_;                      // zero 0
  std::unique_ptr<parallel::GradReducer> reducer_;          // zero 0 with dp > 1
  std::unique_ptr<parallel::DistributedOptimizer> sharded_;  // zero 1 and 2
  std::unique_ptr<parallel::Zero3> zero3_;                   // zero 3
};

}  // namespace loom::parallel
