#include "loom/plan/layout.h"

#include "loom/core/error.h"
#include "loom/model/flops.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/parallel/pipeline/pipeline_step.h"

namespace loom::plan {

int PlannedLayout::in_flight(int stage) const {
  if (!simulation) return 1;
  return simulation->peak_in_flight.at(static_cast<size_t>(stage));
}

PlannedLayout plan_layout(const config::RunConfig& config, comm::MeshShape shape) {
  LOOM_CHECK(shape.dp >= 1 && shape.tp >= 1 && shape.pp >= 1 && shape.cp >= 1,
             "plan_layout: the mesh shape must be resolved");
  PlannedLayout out;
  out.shape = shape;
  const int local_batch = config.train.global_batch / shape.dp;
  out.micro_batches = local_batch / config.train.micro_batch;
  if (shape.pp == 1) {
    LOOM_CHECK(config.parallel.virtual_stages == 1,
               "parallel.virtual_stages = " + std::to_string(config.parallel.virtual_stages) +
                   " needs a pipeline: set parallel.pp > 1 (and pipeline_schedule: interleaved)");
    out.chunks.push_back({{0, config.model.layers}});
    return out;
  }
  LOOM_CHECK(config.parallel.zero != 3, "parallel.zero=3 shards every parameter over the data-parallel ranks around "
                                        "each unit; with pipeline parallelism (parallel.pp > 1) use parallel.zero 0, 1 or 2");
  out.schedule = parallel::make_pipeline_schedule(config.parallel.pipeline_schedule, shape.pp, out.micro_batches,
                                                  config.parallel.virtual_stages);
  out.simulation = parallel::simulate_pipeline(*out.schedule);
  // As the trainer cuts them: by each layer's training FLOPs (balanced) or as configured.
  std::vector<double> costs;
  for (const model::LayerSpec& spec : model::resolve_layers(config.model)) {
    costs.push_back(model::layer_training_flops_per_token(config.model, spec, config.data.seq_len));
  }
  const std::vector<int> bounds =
      parallel::partition_layers(config.parallel.pipeline_partition, costs,
                                 model::head_training_flops_per_token(config.model, config.data.seq_len),
                                 out.schedule->total_stages());
  for (int r = 0; r < shape.pp; ++r) out.chunks.push_back(parallel::stage_chunks(*out.schedule, r, bounds));
  return out;
}

}  // namespace loom::plan
