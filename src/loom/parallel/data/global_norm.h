#pragma once
// The global gradient norm, computed in one place for every ZeRO stage. Each stage supplies the
// reduced gradients it holds, per parameter group: whole (ZeRO 0: every rank of the group holds
// the same sums) or as this rank's shards (ZeRO 1-3). global_norm() takes their sums of squares
// outside the excluded ranges, sums the sharded ones over their group's communicator, then sums
// the total over the model-parallel groups (tensor, pipeline), whose ranks hold different
// parameters. Sums travel as fp64 bits, added in rank order (communication.h: sum_over_group).
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/device.h"
#include "loom/parallel/data/grad_buckets.h"

namespace loom::parallel {

// Reduced gradients of flat elements [range.begin, range.end); `data` points at range.begin.
struct NormPiece {
  const float* data = nullptr;
  FlatRange range;
};

// One parameter group's share of the norm on this rank.
struct NormShare {
  std::vector<NormPiece> pieces;
  // The group's communicator when the pieces are this rank's shards; null when they are whole
  // (already the same on every rank of the group).
  comm::Communicator* sharded_over = nullptr;
  // Ranks holding other parameters of the group (ParameterGroup::partitioned_over), or null.
  comm::Communicator* partitioned_over = nullptr;
  Device device = Device::cpu();  // where the pieces live
  bool counted = true;            // ParameterGroup::norm_counted_here
};

// sqrt of the sum of squares of every share (each element outside `excluded` counted once),
// summed over `model_groups` in turn. `excluded`: sorted, disjoint flat ranges another rank of a
// model-parallel group counts (e.g. copies every tensor-parallel rank holds).
double global_norm(const std::vector<NormShare>& shares, const std::vector<FlatRange>& excluded,
                   const std::vector<comm::Communicator*>& model_groups);

// Sum of squares of flat elements [range.begin, range.end) outside `excluded` (sorted, disjoint).
// `data` points at element range.begin.
double sum_of_squares_excluding(const float* data, FlatRange range, const std::vector<FlatRange>& excluded,
                                Device device = Device::cpu());

}  // namespace loom::parallel
