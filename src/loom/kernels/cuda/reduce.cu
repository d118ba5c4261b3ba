#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/reduce.h"

namespace loom::kernels::cuda {

namespace {

constexpr int64_t kBlock = 4096;  // elements per partial sum, as the CPU

// Squares exact in fp64 and summed there, as the CPU (kernels/cpu/adamw.cpp).
__global__ void block_squares_kernel(const float* __restrict__ x, int64_t n, double* partials) {
  const int64_t begin = blockIdx.x * kBlock, end = min(n, begin + kBlock);
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = x[i];
    sum += v * v;
  }
  sum = block_sum_double(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void sum_partials_kernel(const double* partials, int64_t count, double* total) {
  const double sum = block_sum_in_double(partials, count);
  if (threadIdx.x == 0) *total = sum;
}

__global__ void scale_kernel(float* x, int64_t n, float factor) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) x[i] *= factor;
}

__global__ void add_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) y[i] += x[i];
}

}  // namespace

double sum_of_squares(const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return 0.0;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  void* scratch = nullptr;
  check_cuda(cudaMallocAsync(&scratch, sizeof(double) * (1 + blocks), stream), "cudaMallocAsync");
  double* total = static_cast<double*>(scratch);
  double* partials = total + 1;
  block_squares_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, n, partials);
  check_launch("block_squares_kernel");
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(partials, blocks, total);
  check_launch("sum_partials_kernel");
  double host = 0.0;
  check_cuda(cudaMemcpyAsync(&host, total, sizeof host, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (sum_of_squares)");
  return host;
}

void scale_in_place(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, factor);
  check_launch("scale_kernel");
}

void add_in_place(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, n);
  check_launch("add_kernel");
}

}  // namespace loom::kernels::cuda
