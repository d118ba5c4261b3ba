#include "loom/kernels/cpu/rope.h"
#include "loom/kernels/cpu/parallel.h"

#include <cmath>
#include <vector>

#include "loom/kernels/cpu/half_copies.h"

namespace loom::kernels::cpu {

namespace {
void rotate(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
            int64_t positions_start, const RopeTable& table, const int32_t* positions, float direction) {
  const int64_t hs = table.head_dim, half = hs / 2;
#pragma omp parallel for schedule(static) if(worth_parallel(rows * heads * table.head_dim))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = positions != nullptr ? positions[r] : positions_start + r % seq;
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
                  int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  rotate(x, rows, row_stride, first_col, heads, seq, positions_start, table, positions, 1.0f);
}

void rope_backward(float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                   int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  rotate(dx, rows, row_stride, first_col, heads, seq, positions_start, table, positions, -1.0f);
}

void rope_forward_bf16(void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                       int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  const int64_t width = heads * table.head_dim;
  auto* x = static_cast<uint16_t*>(x16) + first_col;
  std::vector<float> rotated(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r)
    widen_floats(rotated.data() + r * width, x + r * row_stride, width, DType::BF16, false);
  rope_forward(rotated.data(), rows, width, 0, heads, seq, positions_start, table, positions);
  for (int64_t r = 0; r < rows; ++r) narrow_floats(x + r * row_stride, rotated.data() + r * width, width, DType::BF16);
}

}  // namespace loom::kernels::cpu
