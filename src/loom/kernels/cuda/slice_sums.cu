#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/slice_sums.h"

namespace loom::kernels::cuda {

namespace {

__global__ void add_slice_sums_kernel(float* __restrict__ out, const double* __restrict__ partial, int64_t slices,
                                      int64_t width, int64_t stride) {
  for (int64_t i = grid_start(); i < width; i += grid_stride()) {
    double sum = 0.0;
    for (int64_t s = 0; s < slices; ++s) sum += partial[s * stride + i];
    out[i] += static_cast<float>(sum);
  }
}

}  // namespace

int64_t row_slices(int64_t rows, int64_t width) {
  // About 1024 blocks of 256 columns in all, and at most 32 MiB of partial sums.
  const int64_t column_blocks = std::max<int64_t>(1, (width + 255) / 256);
  const int64_t by_blocks = std::max<int64_t>(1, 1024 / column_blocks);
  const int64_t by_memory = std::max<int64_t>(1, (int64_t{4} << 20) / std::max<int64_t>(width, 1));
  return std::max<int64_t>(1, std::min({rows, by_blocks, by_memory}));
}

void add_slice_sums(float* out, const double* partial, int64_t slices, int64_t width, int64_t stride,
                    cudaStream_t stream) {
  if (width == 0) return;
  add_slice_sums_kernel<<<grid_for(width), kThreads, 0, stream>>>(out, partial, slices, width, stride);
  check_launch("add_slice_sums_kernel");
}

}  // namespace loom::kernels::cuda
