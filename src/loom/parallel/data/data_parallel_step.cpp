#include "loom/parallel/data/data_parallel_step.h"

namespace loom::parallel {

namespace {
GradientSyncOptions with_pipeline(comm::Communicator* pp, PipelineSyncOptions pipeline) {
  GradientSyncOptions options;
  options.pp = pp;
  options.pipeline = pipeline;
  return options;
}
}  // namespace

DataParallelStep::DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                                   comm::Communicator* pp, PipelineSyncOptions pipeline)
    : DataParallelStep(dp, model, config, with_pipeline(pp, pipeline)) {}

DataParallelStep::DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                                   GradientSyncOptions options)
    : sync_(make_gradient_sync(dp, model, config, std::move(options))) {}

}  // namespace loom::parallel
