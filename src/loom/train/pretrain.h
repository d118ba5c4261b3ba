#pragma once
// Pre-training: GPT-style samples of an indexed dataset fed to the shared trainer.
#include <iosfwd>

#include "loom/config/run_config.h"
#include "loom/train/training_loop.h"

namespace loom::train {

// Runs `config` (already validated) on the ranks of its runtime (threads in this process, or
// this process as one MPI rank) in the configured layout. SIGINT/SIGTERM finish the current step,
// save a checkpoint and return. Throws loom::Error on bad input (missing data, incompatible
// checkpoint, ...).
TrainSummary pretrain(const config::RunConfig& config, std::ostream& out);

}  // namespace loom::train
