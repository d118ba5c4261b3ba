#include "loom/kernels/types.h"

#include <cmath>

namespace loom::kernels {

RopeTable::RopeTable(int64_t max_positions, int64_t head_dim, double theta) : head_dim(head_dim) {
  const int64_t half = head_dim / 2;
  cos.resize(max_positions * half);
  sin.resize(max_positions * half);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      double freq = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
      double angle = static_cast<double>(pos) * freq;
      cos[pos * half + i] = static_cast<float>(std::cos(angle));
      sin[pos * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

}  // namespace loom::kernels
