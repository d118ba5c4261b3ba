#include "loom/train/trainer_state.h"

#include <omp.h>

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/model/flops.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/train/layout_check.h"
#include "loom/train/run_device.h"

namespace loom::train {

int threads_per_rank(const config::RunConfig& config, const comm::Communicator& world) {
  return config.train.threads_per_rank(omp_get_num_procs(), world.backend() == "threads" ? world.size() : 1);
}

std::string oversubscription_note(const config::RunConfig& config, const comm::Communicator& world) {
  const int threads = threads_per_rank(config, world), processors = omp_get_num_procs();
  if (world.backend() != "threads" || threads < 2 || threads * world.size() <= processors) return "";
  return "threads: train.threads = " + std::to_string(config.train.threads) + " gives each of the " +
         std::to_string(world.size()) + " ranks " + std::to_string(threads) + " threads, " +
         std::to_string(threads * world.size()) + " on this host's " + std::to_string(processors) +
         " processors: oversubscribed ranks wait on each other's threads (1.4-1.5x slower steps measured at 2 "
         "ranks on 2 processors, docs/plan.md); train.threads = " + std::to_string(processors) +
         " or less gives a thread per processor";
}

Trainer::State::State(const config::RunConfig& config, comm::Communicator& w, const BatchSource& source)
    : run(config),
      device(training_device(config, w.rank(), w.size())),
      device_comm(device_world(config, device, w)),
      world(device_comm ? *device_comm : w),
      train(source),
      heartbeat(w.rank(), w.size()),
      faults(config.fault, w.rank(), w.size()),
      mesh(world, check_layout(config, world.size())) {}

// The schedule (checked before anything is built) and this rank's model chunks.
void Trainer::State::plan_pipeline() {
  const int pp = mesh.layout().shape.pp;
  if (pp == 1) {
    LOOM_CHECK(run.parallel.virtual_stages == 1,
               "parallel.virtual_stages = " + std::to_string(run.parallel.virtual_stages) +
                   " needs a pipeline: set parallel.pp > 1 (and pipeline_schedule: interleaved)");
    return;
  }
  schedule = parallel::make_pipeline_schedule(run.parallel.pipeline_schedule, pp,
                                              micro_batches, run.parallel.virtual_stages);
  std::vector<double> costs;
  for (const model::LayerSpec& spec : model::resolve_layers(run.model)) {
    costs.push_back(model::layer_training_flops_per_token(run.model, spec, run.data.seq_len));
  }
  const std::vector<int> bounds = parallel::partition_layers(
      run.parallel.pipeline_partition, costs, model::head_training_flops_per_token(run.model, run.data.seq_len),
      schedule->total_stages());
  chunks = parallel::stage_chunks(*schedule, mesh.pp_rank(), bounds);
}

void Trainer::State::use_global_batch(int64_t global) {
  if (global == step_batch) return;
  step_batch = global;
  local_batch = static_cast<int>(global / mesh.layout().shape.dp);
  micro_batches = local_batch / run.train.micro_batch;
  if (pipeline) {
    pipeline->set_schedule(parallel::make_pipeline_schedule(run.parallel.pipeline_schedule, mesh.layout().shape.pp,
                                                            micro_batches, run.parallel.virtual_stages));
  }
}

void Trainer::State::build_model() {
  const comm::MeshShape shape = mesh.layout().shape;
  const int pp = shape.pp;
  model = std::make_unique<model::Transformer>(run.model,
                                               model::TensorParallel(&mesh.tp(), run.parallel.sequence_parallel,
                                                                     run.parallel.overlap_tp_comm),
                                               model::PrecisionPolicy::from_config(run.precision), chunks,
                                               model::ExpertLayout{shape.ep, mesh.ep_rank()}, device);
  model->initialize(run.train.seed);
  context = parallel::make_context_attention(mesh.cp(), run.parallel.cp_comm, model->params().device());
  model->set_context_attention(context.get());
  for (const model::LayerSpec& spec : model->layers()) has_moe = has_moe || spec.moe;
  if (has_moe) {
    // Tokens of the same layers are routed by every data x context parallel rank of the stage.
    experts = std::make_unique<parallel::ExpertParallel>(mesh.ep(), mesh.dp_cp());
    model->set_expert_comm(experts.get());
  }
  outer = OuterStep::make(run, replicas());  // sites and context parallelism exclude each other (layout_check)
  comm::Communicator& reduced_over = outer ? outer->inner_group() : replicas();
  parallel::GradientSyncOptions options;
  options.pp = pp > 1 ? &mesh.pp() : nullptr;
  if (schedule) options.pipeline = parallel::pipeline_sync_options(*model, *schedule, mesh.embedding());
  // Expert parameters are summed over the expert-data-parallel ranks, the rest over dp x cp.
  if (shape.ep > 1)
    options.groups =
        parallel::expert_parameter_groups(*model, reduced_over, mesh.expert_dp(), mesh.ep(), mesh.tp_rank());
  optimizer = std::make_unique<parallel::DataParallelStep>(reduced_over, *model, run, std::move(options));
  if (schedule) pipeline.emplace(mesh.pp(), *model, *schedule, *optimizer, mesh.embedding());
  if (outer) outer->attach(*model);
  // Loss scaling, Inf/NaN skips, FP8 amaxes (agreed among the ranks holding the same layers).
  precision = std::make_unique<PrecisionStep>(run.precision, *model, *optimizer, world,
                                              pp > 1 ? &mesh.add_group(mesh.layout().shape.cp > 1 ? "tp-cp-dp" : "tp-dp")
                                                     : nullptr);
}

double Trainer::State::forward_backward(float grad_scale) {
  const int micro = run.train.micro_batch, seq = batch.seq;
  // The stages run the replica's micro-batches in the schedule's order; every stage reads them
  // (the first needs the inputs, the last the targets, the first's backward the inputs).
  if (pipeline)
    return pipeline->run(batch.inputs.data(), batch.targets.data(), micro, seq, grad_scale, batch.packing());
  double loss_sum = 0.0;
  for (int m = 0; m < micro_batches; ++m) {
    const bool last_micro_batch = m + 1 == micro_batches;
    // Gradients of the global mean loss are the sum of every rank's contributions: their
    // reduction starts bucket by bucket during backward (see DataParallelStep).
    trace::Range range("micro-batch", m);
    optimizer->begin_micro_batch(last_micro_batch);
    loss_sum += model->forward_backward(batch.micro_inputs(m, micro), batch.micro_targets(m, micro), micro, seq,
                                        grad_scale, batch.packing().at(static_cast<int64_t>(m) * micro * seq));
    optimizer->end_micro_batch(last_micro_batch);
  }
  return loss_sum;
}

int64_t Trainer::State::make_batch(const BatchSource& source, int64_t first, int rows, TokenBatch& into) {
  into.resize(rows, run.data.seq_len);
  source.fill(first, into);
  const int64_t tokens = into.mask_and_count(source, first);
  if (mesh.layout().shape.cp == 1) return tokens;
  return into.keep_context_share(mesh.layout().shape.cp, mesh.cp_rank());
}

double Trainer::State::forward_loss(const TokenBatch& b) {
  return pipeline ? pipeline->forward_loss(b.inputs.data(), b.targets.data(), b.batch, b.seq, b.packing())
                  : model->forward_loss(b.inputs.data(), b.targets.data(), b.batch, b.seq, b.packing());
}

}  // namespace loom::train
