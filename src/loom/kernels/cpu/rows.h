#pragma once
// Operations on blocks of rows inside wider matrices: a column block of one matrix added into a
// column block of another (context parallelism's key/value gradients into the fused qkv rows,
// Ulysses' head blocks accumulated back); rows gathered or scatter-added by index with a per-row
// scale, and per-row dot products (a mixture-of-experts layer's dispatch, combine and gates).
#include <cstdint>

namespace loom::kernels::cpu {

// y[r * y_stride + c] += x[r * x_stride + c] for r < rows, c < width (one addition each).
void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width);

// out[r, :] = scale[r] * x[index[r], :] for r < rows (index null: r; scale null: a plain copy; a
// negative index: a row of zeros, the padding of a grouped GEMM's rows).
void gather_rows(float* out, const float* x, const int32_t* index, const float* scale, int64_t rows, int64_t width);
// out[index[r], :] += scale[r] * x[r * x_stride, :], r in order (index null: r; scale null: 1; an
// x_stride of 0 adds one row to every target): rows sharing a target add in row order.
void scatter_add_rows(float* out, const float* x, int64_t x_stride, const int32_t* index, const float* scale,
                      int64_t rows, int64_t width);
// out[r] = sum_c a[index[r], c] * b[r * b_stride + c] in double, c in order (index null: r).
void row_dots(double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
              int64_t width);

}  // namespace loom::kernels::cpu
