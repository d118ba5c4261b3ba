#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace {

__global__ void broadcast_bias_kernel(float* out, const float* bias, int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t k = grid_start(); k < rows * cols; k += grid_stride()) {
    const float b = bias[k % cols];
    out[k] = accumulate ? out[k] + b : b;
  }
}

__global__ void column_sums_kernel(float* sums, const float* x, int64_t rows, int64_t cols) {
  for (int64_t c = grid_start(); c < cols; c += grid_stride()) {
    float s = sums[c];
    for (int64_t r = 0; r < rows; ++r) s += x[r * cols + c];
    sums[c] = s;
  }
}

}  // namespace

void broadcast_bias(float* out, const float* bias, int64_t rows, int64_t cols, bool accumulate, cudaStream_t stream) {
  if (rows * cols == 0) return;
  broadcast_bias_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(out, bias, rows, cols, accumulate);
  check_launch("broadcast_bias_kernel");
}

void add_column_sums(float* sums, const float* x, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols == 0) return;
  column_sums_kernel<<<grid_for(cols), kThreads, 0, stream>>>(sums, x, rows, cols);
  check_launch("column_sums_kernel");
}

}  // namespace loom::kernels::cuda
