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

// The layout checks that need no rank: done here when the world size is known before launch
// (the threads backend's runtime.ranks), else by every rank at set-up.
void check_layout_before_launch(const config::RunConfig& config);

// What one rank runs; the summary of the rank that reports (rank 0) is returned.
using RankRecipe = std::function<TrainSummary(comm::Communicator& world)>;
TrainSummary run_on_ranks(const config::RunConfig& config, std::ostream& out, const RankRecipe& recipe);

// The shared wiring of a training recipe on one rank: a Trainer over `train` (and `validation`,
// may be null), restored when train.resume asks, described, and run to the end.
TrainSummary train_rank(const config::RunConfig& config, comm::Communicator& world, const BatchSource& train,
                        const BatchSource* validation, std::ostream& out);

}  // namespace loom::train
