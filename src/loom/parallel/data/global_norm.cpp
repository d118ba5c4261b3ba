#include "loom/parallel/data/global_norm.h"

#include <algorithm>

#include "loom/kernels/cpu/adamw.h"

namespace loom::parallel {

double sum_over_groups(double local, comm::Communicator& group, const std::vector<comm::Communicator*>& more) {
  auto sum_over = [](comm::Communicator& g, double value) {
    if (g.size() == 1) return value;
    float v = static_cast<float>(value);
    g.all_reduce(&v, 1, DType::F32, comm::ReduceOp::Sum);
    return static_cast<double>(v);
  };
  double total = sum_over(group, local);
  for (comm::Communicator* g : more) total = sum_over(*g, total);
  return total;
}

double sum_of_squares_excluding(const float* data, FlatRange range, const std::vector<FlatRange>& excluded) {
  double total = 0.0;
  int64_t at = range.begin;
  auto add_until = [&](int64_t end) {
    if (end > at) total += kernels::cpu::sum_of_squares(data + (at - range.begin), end - at);
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
