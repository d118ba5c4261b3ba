#pragma once
// The global gradient norm of sharded optimizers: each rank's sum of squares over what it owns,
// summed over the groups that shard the parameters.
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/parallel/data/grad_buckets.h"

namespace loom::parallel {

// Sums a per-rank value (e.g. a squared gradient norm) over `group` and then each of `more`.
// Carried in f32 (the reducible dtypes): its rounding moves a clip factor by ~1e-7 relative.
double sum_over_groups(double local, comm::Communicator& group, const std::vector<comm::Communicator*>& more);

// Sum of squares of flat elements [range.begin, range.end) outside `excluded` (sorted, disjoint
// ranges: parameters another rank counts, e.g. copies held by every tensor-parallel rank).
// `data` points at element range.begin.
double sum_of_squares_excluding(const float* data, FlatRange range, const std::vector<FlatRange>& excluded);

}  // namespace loom::parallel
