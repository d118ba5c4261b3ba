#pragma once
// Pre-training: the loop that wires model, data, optimizer, metrics and checkpoints together.
#include <iosfwd>
#include <optional>

#include "loom/config/run_config.h"

namespace loom::train {

struct TrainSummary {
  bool reporter = true;  // this process hosts rank 0 (the one that prints and writes files)
  int first_step = 0;  // the first step this invocation ran
  int last_step = 0;   // the last step completed
  double first_loss = 0.0, last_loss = 0.0;
  std::optional<double> first_val_loss, last_val_loss;
  double tokens_per_s = 0.0;  // mean over steps after the first
  double gflops_per_s = 0.0;  // achieved model FLOP/s over the same steps
  std::string checkpoint;     // the last checkpoint written
};

// Runs `config` (already validated) on the ranks of `runtime` (threads in this process, or this
// process as one MPI rank) with data parallelism over them. SIGINT/SIGTERM finish the current
// step, save a checkpoint and return. Throws loom::Error on bad input (missing data,
// incompatible checkpoint, ...).
TrainSummary pretrain(const config::RunConfig& config, std::ostream& out);

}  // namespace loom::train
