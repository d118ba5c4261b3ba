#include "loom/kernels/cpu/rows.h"

#include "loom/kernels/parallel.h"

namespace loom::kernels::cpu {

void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    float* to = y + r * y_stride;
    const float* from = x + r * x_stride;
    for (int64_t c = 0; c < width; ++c) to[c] += from[c];
  }
}

}  // namespace loom::kernels::cpu
