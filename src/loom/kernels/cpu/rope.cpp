#include "loom/kernels/cpu/rope.h"
#include "loom/kernels/cpu/parallel.h"

#include <cmath>

namespace loom::kernels::cpu {

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

namespace {
void rotate(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
            int64_t positions_start, const RopeTable& table, float direction) {
  const int64_t hs = table.head_dim, half = hs / 2;
#pragma omp parallel for schedule(static) if(worth_parallel(rows * heads * table.head_dim))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = positions_start + r % seq;
    const float* c = table.cos.data() + pos * half;
    const float* s = table.sin.data() + pos * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + first_col + h * hs;
      for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half], sn = direction * s[i];
        v[i] = a * c[i] - b * sn;
        v[i + half] = b * c[i] + a * sn;
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                  int64_t seq, int64_t positions_start, const RopeTable& table) {
  rotate(x, rows, row_stride, first_col, heads, seq, positions_start, table, 1.0f);
}

void rope_backward(float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                   int64_t seq, int64_t positions_start, const RopeTable& table) {
  rotate(dx, rows, row_stride, first_col, heads, seq, positions_start, table, -1.0f);
}

}  // namespace loom::kernels::cpu
