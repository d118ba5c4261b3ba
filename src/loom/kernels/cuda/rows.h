#pragma once
// Row-block operations on the device, with the contracts of kernels::cpu (rows.h): add_rows adds
// a column block of x into one of y, bit for bit the CPU's (one rounded addition per element);
// gather_rows, scatter_add_rows (with an index, each target's rows added in row order by
// grouped_rows.h's sorted groups: deterministic, bit for bit the CPU's where it rounds each add) and
// row_dots (one thread per row, summing in the CPU's order) move and reduce rows by index.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width,
              cudaStream_t stream = nullptr);
void gather_rows(float* out, const float* x, const int32_t* index, const float* scale, int64_t rows, int64_t width,
                 cudaStream_t stream = nullptr);
void scatter_add_rows(float* out, const float* x, int64_t x_stride, const int32_t* index, const float* scale,
                      int64_t rows, int64_t width, cudaStream_t stream = nullptr);
void row_dots(double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
              int64_t width, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
