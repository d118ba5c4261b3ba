#pragma once
// Row-block operations on the device, with the contracts of kernels::cpu (rows.h): add_rows adds
// a column block of x into one of y, bit for bit the CPU's (one rounded addition per element).
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width,
              cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
