#include "loom/parallel/global_norm.h"

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

}  // namespace loom::parallel
