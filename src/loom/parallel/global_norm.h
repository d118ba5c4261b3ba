#pragma once
// The global gradient norm of sharded optimizers: each rank's sum of squares over what it owns,
// summed over the groups that shard the parameters.
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::parallel {

// Sums a per-rank value (e.g. a squared gradient norm) over `group` and then each of `more`.
// Carried in f32 (the reducible dtypes): its rounding moves a clip factor by ~1e-7 relative.
double sum_over_groups(double local, comm::Communicator& group, const std::vector<comm::Communicator*>& more);

}  // namespace loom::parallel
