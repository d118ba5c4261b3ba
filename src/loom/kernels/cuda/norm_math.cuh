#pragma once
// One row's RMSNorm or LayerNorm on the device (device code): the statistics of the norms' forward
// kernels (rmsnorm.cu, layernorm.cu) and the output elements they and the FP8 codes of their
// outputs (norm_codes.cu) compute, so both compute the same outputs bit for bit. Every thread of a
// block of kThreads threads calls the row functions (there are __syncthreads inside); `shared`
// holds kThreads floats.
#include <algorithm>
#include <cstdint>

#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

// Sum of `value` over the block by a tree in shared memory (every thread gets it): RMSNorm's order.
__device__ inline float tree_block_sum(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

// RMSNorm: 1 / sqrt(mean(x^2) + eps) of row x, and an output element.
__device__ inline float rms_row_rstd(const float* x, int64_t dim, float eps, float* shared) {
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum_sq += x[i] * x[i];
  return rsqrtf(tree_block_sum(sum_sq, shared) / static_cast<float>(dim) + eps);
}
__device__ inline float rms_value(float x, float rstd, float weight) { return x * rstd * weight; }

// LayerNorm: the mean and 1 / sqrt(variance + eps) of row x, and an output element.
struct LayerRowStats {
  float mean, rstd;
};
__device__ inline LayerRowStats layer_row_stats(const float* x, int64_t dim, float eps, float* shared) {
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += x[i];
  const float m = block_sum(sum, shared) / static_cast<float>(dim);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) var += (x[i] - m) * (x[i] - m);
  return {m, rsqrtf(block_sum(var, shared) / static_cast<float>(dim) + eps)};
}
__device__ inline float layer_value(float x, float mean, float rstd, float weight, float bias) {
  return (x - mean) * rstd * weight + bias;
}

// The forward kernels' grid: a block per row, or with an amax a capped grid walking the rows (one
// atomic per block, not per row: about two resident waves, as the amax passes').
inline unsigned norm_rows_grid(int64_t rows, const float* amax) {
  return static_cast<unsigned>(amax != nullptr ? std::min<int64_t>(rows, 2 * kAmaxBlocks) : rows);
}

}  // namespace loom::kernels::cuda
