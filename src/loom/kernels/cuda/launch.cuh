#pragma once
// Launch shapes and block-wide reductions shared by the CUDA kernels (device code only).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

constexpr int kThreads = 256;

// Runs `launch(word)` on `stream` with `word` a zeroed device unsigned, then reads it back (the
// stream synchronised): the one-word results of reductions such as amax and the non-finite check.
template <typename Launch>
unsigned read_back_word(cudaStream_t stream, const char* what, Launch launch) {
  unsigned* word = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&word), sizeof(unsigned), stream), "cudaMallocAsync");
  check_cuda(cudaMemsetAsync(word, 0, sizeof(unsigned), stream), "cudaMemsetAsync");
  launch(word);
  unsigned host = 0;
  check_cuda(cudaMemcpyAsync(&host, word, sizeof host, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check_cuda(cudaFreeAsync(word, stream), "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(stream), std::string("cudaStreamSynchronize (") + what + ")");
  return host;
}

// Enough blocks of kThreads to cover n elements with a grid-stride loop, at most 65536.
inline unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65536)));
}

// The first index of this thread and the stride of a grid-stride loop.
__device__ inline int64_t grid_start() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// A launch over a row-major [rows, cols] matrix that finds each element's row and column without
// dividing (a 64-bit division per element costs more than the element's bytes in these
// memory-bound kernels): threads along the columns (a multiple of 32, at most kThreads, fewer for
// narrow rows), one block row per matrix row; both grid-stride. In the kernel:
//   for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
//     for (int64_t c = column_start(); c < cols; c += column_stride()) ...
struct RowsLaunch {
  dim3 grid, block;
};
inline RowsLaunch launch_over_rows(int64_t rows, int64_t cols) {
  const int64_t threads = std::min<int64_t>(kThreads, std::max<int64_t>(32, (cols + 31) / 32 * 32));
  const int64_t x = std::max<int64_t>(1, std::min<int64_t>((cols + threads - 1) / threads, 65535));
  const int64_t y = std::max<int64_t>(1, std::min<int64_t>(rows, 65535));
  return {dim3(static_cast<unsigned>(x), static_cast<unsigned>(y)), dim3(static_cast<unsigned>(threads))};
}
__device__ inline int64_t column_start() { return blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; }
__device__ inline int64_t column_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum (or max) of `value` over a block of kThreads threads; every thread gets it. `shared` holds
// kThreads / 32 floats. Deterministic for a given block size.
__device__ inline float block_sum(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_sum(value);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += shared[w];
  return total;
}
__device__ inline float block_max(float value, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float m = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) m = fmaxf(m, shared[w]);
  return m;
}

// The sum of each thread's `sum` over a block of kThreads threads, by a fixed tree: deterministic.
// Every thread gets it.
__device__ inline double block_sum_double(double sum) {
  __shared__ double partial[kThreads];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  return partial[0];
}
// The sum of x[0, n) in double by one block of kThreads threads: each thread a fixed strided
// share, then the tree above, so the result is deterministic. Every thread gets it.
template <typename T>
__device__ inline double block_sum_in_double(const T* x, int64_t n) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i];
  return block_sum_double(sum);
}

}  // namespace loom::kernels::cuda
