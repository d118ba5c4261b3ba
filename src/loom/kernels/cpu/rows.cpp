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

void gather_rows(float* out, const float* x, const int32_t* index, const float* scale, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    float* to = out + r * width;
    if (index != nullptr && index[r] < 0) {
      for (int64_t c = 0; c < width; ++c) to[c] = 0.0f;
      continue;
    }
    const float* from = x + (index ? index[r] : r) * width;
    if (scale == nullptr) {
      for (int64_t c = 0; c < width; ++c) to[c] = from[c];
    } else {
      const float w = scale[r];
      for (int64_t c = 0; c < width; ++c) to[c] = w * from[c];
    }
  }
}

void scatter_add_rows(float* out, const float* x, int64_t x_stride, const int32_t* index, const float* scale,
                      int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    float* to = out + (index ? index[r] : r) * width;
    const float* from = x + r * x_stride;
    const float w = scale ? scale[r] : 1.0f;
    for (int64_t c = 0; c < width; ++c) to[c] += w * from[c];
  }
}

void row_dots(double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
              int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a + (index ? index[r] : r) * width;
    const float* y = b + r * b_stride;
    double dot = 0.0;
    for (int64_t c = 0; c < width; ++c) dot += static_cast<double>(x[c]) * y[c];
    out[r] = dot;
  }
}

}  // namespace loom::kernels::cpu
