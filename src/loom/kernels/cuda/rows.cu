#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/rows.h"

namespace loom::kernels::cuda {

namespace {

__global__ void add_rows_kernel(float* __restrict__ y, int64_t y_stride, const float* __restrict__ x, int64_t x_stride,
                                int64_t rows, int64_t width) {
  const int64_t n = rows * width;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = k / width, c = k % width;
    y[r * y_stride + c] = __fadd_rn(y[r * y_stride + c], x[r * x_stride + c]);
  }
}

}  // namespace

void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width,
              cudaStream_t stream) {
  if (rows * width == 0) return;
  add_rows_kernel<<<grid_for(rows * width), kThreads, 0, stream>>>(y, y_stride, x, x_stride, rows, width);
  check_launch("add_rows_kernel");
}

}  // namespace loom::kernels::cuda
