#pragma once
// Operations on blocks of rows inside wider matrices: a column block of one matrix added into a
// column block of another (context parallelism's key/value gradients into the fused qkv rows,
// Ulysses' head blocks accumulated back).
#include <cstdint>

namespace loom::kernels::cpu {

// y[r * y_stride + c] += x[r * x_stride + c] for r < rows, c < width (one addition each).
void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width);

}  // namespace loom::kernels::cpu
