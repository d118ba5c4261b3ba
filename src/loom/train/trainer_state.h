#pragma once
// What one rank's Trainer holds (trainer.h): the run, its mesh, model, gradient synchronisation,
// pipeline and precision step. Private to the trainer's sources (trainer.cpp, trainer_state.cpp,
// trainer_checkpoint.cpp).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/ckpt/async_writer.h"
#include "loom/comm/mesh.h"
#include "loom/model/transformer.h"
#include "loom/ops/fault_injection.h"
#include "loom/ops/heartbeat_writer.h"
#include "loom/ops/step_trace.h"
#include "loom/parallel/context/context_parallel.h"
#include "loom/parallel/data/data_parallel_step.h"
#include "loom/parallel/expert/expert_parallel.h"
#include "loom/parallel/pipeline/pipeline_step.h"
#include "loom/train/memory_check.h"
#include "loom/train/outer_step.h"
#include "loom/train/precision_step.h"
#include "loom/train/run_directory.h"
#include "loom/train/trainer.h"

namespace loom::train {

struct Trainer::State {
  config::RunConfig run;
  Device device;  // runtime.device: where this rank trains
  std::unique_ptr<comm::Communicator> device_comm;  // the world wrapped for device buffers (run_device.h), or null
  comm::Communicator& world;
  const BatchSource& train;
  MemoryCheck memory_check;  // the resident set before anything of the run is built
  ops::Heartbeat heartbeat;  // for `loom launch` (docs/operations.md)
  ops::FaultInjector faults;
  comm::Mesh mesh;
  int64_t total_steps = 0;  // train.steps, or the steps of train.samples (batch_schedule.h)
  // This step's global batch (train.rampup_batch_size moves it), its share on this replica and
  // that share's micro-batches.
  int64_t step_batch = 0;
  int micro_batches = 0, local_batch = 0;
  std::optional<parallel::PipelineSchedule> schedule;
  std::vector<model::LayerRange> chunks;
  std::unique_ptr<model::Transformer> model;
  std::unique_ptr<model::ContextAttention> context;  // parallel.cp > 1: attention over the cp group
  std::unique_ptr<OuterStep> outer;  // parallel.outer=diloco; its site groups outlive the optimizer
  bool has_moe = false;                                // some layer of the model is a mixture of experts
  std::unique_ptr<parallel::ExpertParallel> experts;  // the MoE layers' exchange
  std::unique_ptr<parallel::DataParallelStep> optimizer;
  std::optional<parallel::PipelineStep> pipeline;
  std::unique_ptr<PrecisionStep> precision;
  std::unique_ptr<RunDirectory> run_directory;  // rank 0: the run directory's lock and checks
  TrainingProgress progress;
  TokenBatch batch;
  std::vector<float> saved_from_device;  // a GPU run's checkpoint ranges, copied to the host
  StepObjective* objective = nullptr;  // reinforcement learning's, in place of cross-entropy
  ckpt::AsyncCheckpointWriter async_writer;
  std::unique_ptr<ops::StepTrace> trace;  // profile.*: this rank's profiled steps, or null
  int64_t steps_run = 0;                  // steps since this trainer was made

  State(const config::RunConfig& config, comm::Communicator& w, const BatchSource& source);

  void plan_pipeline();
  // Sizes the next steps for a global batch of `global` sequences (the pipeline's schedule too).
  void use_global_batch(int64_t global);
  void build_model();
  // The sum of token losses of the replica's micro-batches (the last stage's; 0 elsewhere).
  double forward_backward(float grad_scale);
  double forward_loss(const TokenBatch& b);
  // The ranks holding the same parameters: data x context parallel (replicated parameters see
  // different tokens on each).
  comm::Communicator& replicas() { return mesh.layout().shape.cp > 1 ? mesh.dp_cp() : mesh.dp(); }
  // Fills `batch` with global samples from `first`, masks it, keeps this rank's context share and
  // returns the targets that count in it.
  int64_t make_batch(const BatchSource& source, int64_t first, int rows, TokenBatch& batch);
};

// Threads per rank: the threads backend runs every rank in this process, so the cores are shared.
int threads_per_rank(const config::RunConfig& config, const comm::Communicator& world);
// A line for the console where the threads backend's ranks get more threads together than the host
// has processors (train.threads above them): such ranks wait on each other's threads. Empty otherwise.
std::string oversubscription_note(const config::RunConfig& config, const comm::Communicator& world);

}  // namespace loom::train
