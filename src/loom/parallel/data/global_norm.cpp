#include "loom/parallel/data/global_norm.h"

#include <algorithm>
#include <cmath>

#include "loom/kernels/ops.h"
#include "loom/parallel/data/communication.h"

namespace loom::parallel {

double global_norm(const std::vector<NormShare>& shares, const std::vector<FlatRange>& excluded,
                   const std::vector<comm::Communicator*>& model_groups) {
  double total = 0.0;
  for (const NormShare& share : shares) {
    double local = 0.0;
    for (const NormPiece& p : share.pieces) local += sum_of_squares_excluding(p.data, p.range, excluded, share.device);
    double group = share.sharded_over != nullptr ? sum_over_group(*share.sharded_over, local) : local;
    if (share.partitioned_over != nullptr) group = sum_over_group(*share.partitioned_over, group);
    if (share.counted) total += group;
  }
  for (comm::Communicator* g : model_groups) total = sum_over_group(*g, total);
  return std::sqrt(total);
}

double sum_of_squares_excluding(const float* data, FlatRange range, const std::vector<FlatRange>& excluded,
                                Device device) {
  double total = 0.0;
  int64_t at = range.begin;
  auto add_until = [&](int64_t end) {
    if (end > at) total += kernels::sum_of_squares(device, data + (at - range.begin), end - at);
  };
  for (const FlatRange& skip : excluded) {
    if (skip.end <= at) continue;
    if (skip.begin >= range.end) break;
    add_until(std::min(skip.begin, range.end));
    at = std::max(at, skip.end);
  }
  add_until(range.end);
  return total;
}

}  // namespace loom::parallel
