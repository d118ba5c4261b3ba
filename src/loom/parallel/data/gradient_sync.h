#pragma once
// Gradient synchronisation over the data-parallel ranks and the optimizer step, one interface
// with one implementation per ZeRO stage (parallel.zero), made by make_gradient_sync():
//   0 (DdpSync, ddp_sync.h): every rank holds everything; buckets are all-reduced during the
//     last micro-batch's backward, then each rank runs the same optimizer step.
//   1, 2 (ShardedSync, sharded_sync.h): buckets are reduce-scattered; master weights and moments
//     exist for this rank's shards only; updated shards are all-gathered (distributed_optimizer.h).
//     Zero 2 reduces after every micro-batch and keeps only the reduced shards across them.
//   3 (Zero3Sync, zero3_sync.h): parameters sharded too (zero3.h); each unit's parameters are
//     gathered around its forward and backward and released after; gradients are reduce-scattered
//     per unit. Outside a micro-batch the model's values buffer holds nothing:
//     gather_full_parameters() before reading it (checkpoints, evaluation), release after.
//     ZeRO 1-2 under parallel.overlap_param_gather leave the update's gathers in flight, awaited
//     unit by unit by the hooks: gather_full_parameters() waits for all of them.
// Every implementation is the model's ParameterHooks, installed by itself while it needs them.
// Parameters come in groups, each reduced over its own communicator ("dense" over the data-
// parallel group; with expert parallelism, "expert" over the expert-data-parallel group).
// The global norm is global_norm.h's, the update optim::Optimizer's, and every collective goes
// through communication.h. With one rank and zero 0 nothing is communicated.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/model/parameter_hooks.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/cross_site_worker.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/parallel/data/parameter_ranges.h"

namespace loom::parallel {

// Parameters whose gradients are summed over one communicator: the ranks holding the same copy.
struct ParameterGroup {
  std::string name;         // "dense", "expert"
  std::vector<int> params;  // parameter ids (model::ParameterStore order)
  comm::Communicator* comm = nullptr;
  // Ranks holding different parameters of this group (the expert-parallel group: each holds its
  // own experts): the gradient norm of the group sums over them too. Null: none.
  comm::Communicator* partitioned_over = nullptr;
  // Whether this rank adds the group's norm (summed over partitioned_over) to the total that the
  // model-parallel groups sum: false where another tensor-parallel rank adds the same sum (experts
  // spread over the tensor-parallel ranks, whose expert-parallel sum already covers them).
  bool norm_counted_here = true;
};

// What a pipeline stage needs of the synchronisation (parallel/pipeline/pipeline_step.h makes it).
struct PipelineSyncOptions {
  // Tied embeddings: the first stage's embedding and the last stage's copy (`tied_param`) have
  // their gradients summed over `tied_group` (the two stages) when a reduction round ends,
  // before the data-parallel reduction, so both copies take the same update.
  comm::Communicator* tied_group = nullptr;
  int tied_param = -1;
  // Interleaved schedules spread a micro-batch's backward over time, so zero 2 reduces once per
  // step as zero 1 does (the gradient buffer lives through the step).
  bool reduce_once_per_step = false;
};

struct GradientSyncOptions {
  // Empty: one group "dense" of every parameter over the data-parallel group.
  std::vector<ParameterGroup> groups;
  // The pipeline group when the model is a pipeline stage: the norm sums over the stages (zero 0-2).
  comm::Communicator* pp = nullptr;
  PipelineSyncOptions pipeline;
};

class GradientSync : public model::ParameterHooks {
 public:
  ~GradientSync() override = default;

  // Before each micro-batch's forward_backward (last = the step's final micro-batch).
  virtual void begin_micro_batch(bool last) = 0;
  // After each micro-batch's forward_backward.
  virtual void end_micro_batch(bool last) = 0;
  // After the last micro-batch: the global norm of the reduced gradients before clipping
  // (global_norm.h), the same on every rank of the model. Collective over the model's groups.
  // Inf or NaN when any gradient it counts is (squares summed in fp64 cannot overflow), so it is
  // also mixed precision's check for a step to skip (train/precision_step.h): no pass of its own.
  virtual double gradient_norm() = 0;
  // Clip by `norm` (gradient_norm()'s) and update; parameters are identical on every rank of a
  // group afterwards, and the gradients are cleared for the next step.
  virtual void update(double lr, int64_t step, double norm) = 0;
  // gradient_norm(), then update() with it; returns the norm.
  double step(double lr, int64_t step) {
    const double norm = gradient_norm();
    update(lr, step, norm);
    return norm;
  }
  // After the last micro-batch, before gradient_norm(): the reduced gradients this rank holds
  // (the whole buffer at zero 0, its shards at 1-3), for mixed precision (train/precision_step.h)
  // to unscale. skip_step() replaces update() when a step is skipped.
  virtual std::vector<std::span<float>> reduced_gradients() = 0;
  // Whether those are in host memory while the parameters are on a GPU (ZeRO-3's shards under
  // parallel.offload_params): unscaled there, by the host.
  virtual bool reduced_gradients_on_host() const { return false; }
  virtual void skip_step() = 0;
  // Restores the moments from full flat buffers (each rank keeps its shards); parameters must
  // already hold the checkpoint's values (zero 3 re-shards them from there).
  virtual void load_moments(const float* exp_avg, const float* exp_avg_sq) = 0;
  // The flat ranges of the parameter buffer whose values (the fp32 master weights) and moments
  // this rank writes to a checkpoint: disjoint over the data-parallel ranks, together the whole
  // buffer (zero 1-3: the shards it owns; zero 0: an even split of the replicated state).
  virtual std::vector<OwnedRange> checkpoint_ranges() const = 0;
  // Collective. The model's values buffer holds the full parameters until release (zero 3; the
  // other stages always hold them, and these do nothing).
  virtual void gather_full_parameters() {}
  virtual void release_full_parameters() {}
  // Fraction of the gradient communication hidden behind backward, over all steps so far.
  virtual double hidden_fraction() const = 0;
  // Per-rank bytes by category: parameters, gradients, master weights, moments, comm buffers.
  virtual MemoryBytes memory_bytes() const = 0;
  virtual std::string memory_report() const = 0;
  // The measured peak so far and the process's peak RSS; for the report after the first step.
  virtual std::string peak_memory_report() const = 0;
  // The parameters were replaced from outside (DiLoCo's outer step): the optimizer's master
  // weights follow them. Not collective.
  virtual void parameters_changed() {}
  // A bf16 copy of the model's parameter values (2-byte elements in the values buffer's layout)
  // that the last update wrote and nothing has written over since (bf16_parameter_copy.h), for a
  // bf16 model's GEMMs; null where none is kept or it is not current.
  virtual const void* bf16_values() const { return nullptr; }
  // ZeRO 1-2: seconds this rank blocked waiting for parameter all-gathers since the previous
  // update, that update's own wait included (in the forward instead under
  // parallel.overlap_param_gather); zero at the other stages.
  virtual double last_step_parameter_wait_s() const { return 0.0; }
  // Across sites: the bytes this rank sent inside its site and across sites, and the time the
  // training thread blocked on gradient communication, during the last step (zero otherwise).
  virtual SiteTraffic last_step_traffic() const { return {}; }
  // Whether the data-parallel group spans more than one site.
  virtual bool across_sites() const { return false; }
  // What it was built with for a pipeline stage.
  virtual const PipelineSyncOptions& pipeline_options() const = 0;
};

// The implementation for config.parallel.zero. `dp`: the ranks holding the same shard of the
// model (the model's tensor-parallel group, if any, is taken from the model: the norm sums over
// it too).
std::unique_ptr<GradientSync> make_gradient_sync(comm::Communicator& dp, model::Transformer& model,
                                                 const config::RunConfig& config, GradientSyncOptions options = {});

}  // namespace loom::parallel
