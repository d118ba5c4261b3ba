#pragma once
// Executes a pipeline schedule (parallel/pipeline_schedule.h) on one pipeline rank: its model
// chunks run the forward and backward passes of the step's micro-batches in the order of the
// rank's instruction list, activations and gradients travel between stages with asynchronous
// point-to-point messages (sends never block; a receive waits only when its data is needed; the
// messages of consecutive instructions go as one batch, so neighbours that both send first
// cannot wait on each other where a send waits for its recv, as under NCCL; the schedules' lists
// are checked for that in pipeline_rendezvous.h), and the data-parallel step reduces the
// gradients as the schedule's backwards complete.
//
// Each (micro-batch, chunk) in flight has its own model::Activations, taken from a pool and
// returned after its backward, so a stage holds at most as many micro-batches' activations as
// its schedule keeps in flight (1F1B: p - stage). With model.recompute each keeps only its
// chunk's inputs.
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/model/transformer.h"
#include "loom/parallel/pipeline/pipeline_schedule.h"
#include "loom/parallel/data/gradient_sync.h"

namespace loom::parallel {

// What the last run() measured on this rank.
struct PipelineStats {
  double compute_seconds = 0.0;  // in forward and backward passes
  double wait_seconds = 0.0;     // blocked in receives and in the final wait for sends
  int peak_in_flight = 0;        // (micro-batch, chunk) activations held at once
  int64_t peak_activation_bytes = 0;
};

// The layers of `rank`'s model chunks, from the virtual stages' boundaries (as
// parallel::partition_layers returns them).
std::vector<model::LayerRange> stage_chunks(const parallel::PipelineSchedule& schedule, int rank,
                                            const std::vector<int>& bounds);

// What the gradient synchronisation of `model`'s stage must be built with (GradientSyncOptions::
// pipeline): tied embeddings summed over `embedding` (the first and last stage), zero 2 reducing
// once per step when the schedule interleaves chunks.
PipelineSyncOptions pipeline_sync_options(const model::Transformer& model, const parallel::PipelineSchedule& schedule,
                                          comm::Communicator* embedding);

class PipelineStep {
 public:
  // `pp`: the pipeline group (this rank's stage is pp.rank()); the model holds this rank's
  // chunks of the schedule's virtual stages (stage_chunks). `dp` reduces the stage's gradients;
  // it must have been made with pipeline_sync_options(model, schedule, embedding) (checked).
  PipelineStep(comm::Communicator& pp, model::Transformer& model, parallel::PipelineSchedule schedule,
               GradientSync& dp, comm::Communicator* embedding);
  ~PipelineStep();

  // One optimizer step's micro-batches: inputs and targets hold schedule.micro_batches
  // micro-batches of [batch, seq] back to back. Gradients of grad_scale * (sum of token
  // losses) are added to the model's and reduced by the data-parallel step (begin/end_micro_batch
  // around each backward, the last one at the schedule's reduce_gradients). Returns this rank's
  // sum of token losses: the last stage's, 0 on the others.
  // `packing`: the documents and positions of the same micro-batches (every stage needs them).
  double run(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq, float grad_scale,
             const model::Packing& packing = {});

  // Evaluation: one micro-batch forward through every stage; the sum of token losses, on every
  // rank of the pipeline.
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                      const model::Packing& packing = {});

  const parallel::PipelineSchedule& schedule() const { return schedule_; }
  // The schedule of the next steps (another micro-batch count, as a batch ramp-up takes): the
  // same kind, stages and virtual stages (checked), between steps.
  void set_schedule(parallel::PipelineSchedule schedule);
  const PipelineStats& last_stats() const { return stats_; }

 private:
  struct InFlight {
    std::unique_ptr<model::Activations> activations;
    std::vector<comm::WorkHandle> sends;  // reading from the activations
  };
  using Key = std::pair<int, int>;  // (micro-batch, chunk)

  InFlight& acquire(Key key);
  // A Forward instruction: the chunk's forward on the micro-batch; its loss sum (last stage).
  double forward(Key key, const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq, float grad_scale,
                 const model::Packing& packing);
  void release(Key key);
  void recycle(bool wait);
  comm::WorkHandle start_messages(size_t begin, size_t end, int64_t rows, int64_t count);
  // Waits for `work` (the time counts as idle).
  void wait_for(const comm::WorkHandle& work);

  comm::Communicator& pp_;
  model::Transformer& model_;
  GradientSync& dp_;
  parallel::PipelineSchedule schedule_;
  int rank_;
  std::map<Key, InFlight> live_;
  std::vector<InFlight> retiring_;  // released, their sends still in flight
  std::vector<std::unique_ptr<model::Activations>> pool_;
  std::vector<InFlight> evaluation_;  // one per chunk
  PipelineStats stats_;
};

}  // namespace loom::parallel
