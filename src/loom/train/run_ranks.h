#pragma once
// Starting a recipe on every rank of a run: the world comes from the configured backend (ranks
// as threads of this process, or this process as one MPI rank under mpirun/srun), with simulated
// links between the threads when topology.simulate asks for them.
#include <functional>
#include <iosfwd>

#include "loom/comm/communicator.h"
#include "loom/config/run_config.h"
#include "loom/train/batch_source.h"
#include "loom/train/training_loop.h"

namespace loom::train {

// What one rank runs.
using RankRecipe = std::function<TrainSummary(comm::Communicator& world)>;

// Runs `recipe` on every rank; the summary of the rank that reports (rank 0) is returned. Before any rank
// starts, the layout is checked against the world when its size is known up front (the threads
// backend's runtime.ranks; launched worlds check it on every rank at set-up), then
// `before_launch` runs (a recipe's own checks that need no rank, e.g. of its data).
TrainSummary run_on_ranks(const config::RunConfig& config, std::ostream& out, const RankRecipe& recipe,
                          const std::function<void()>& before_launch = {});

// The data a run evaluates on, either may be null: the validation set (every train.eval_interval
// steps) and the test set (once, after the last step).
struct HeldOutData {
  const BatchSource* validation = nullptr;
  const BatchSource* test = nullptr;
};

// The shared wiring of a training recipe on one rank: a Trainer over `train` (evaluating on
// `held_out`), restored when train.resume asks, described, and run to the end.
TrainSummary train_rank(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
                        HeldOutData held_out, std::ostream& out);

}  // namespace loom::train
