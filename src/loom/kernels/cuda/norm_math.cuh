#pragma once
// One row's RMSNorm or LayerNorm on the device (device code): the statistics of the norms' forward
// kernels (rmsnorm.cu, layernorm.cu) from the row's sums (norm_rows.cuh's order), and the output
// elements they and the FP8 codes of their outputs (norm_codes.cu) compute, so both compute the
// same outputs bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

// RMSNorm: 1 / sqrt(mean(x^2) + eps) of a row from its sum of squares, and an output element.
__device__ inline float rms_rstd(float sum_sq, int64_t dim, float eps) {
  return rsqrtf(sum_sq / static_cast<float>(dim) + eps);
}
__device__ inline float rms_value(float x, float rstd, float weight) { return x * rstd * weight; }

// LayerNorm: a row's mean from its sum, 1 / sqrt(variance + eps) from its sum of (x - mean)^2, and
// an output element.
__device__ inline float layer_mean(float sum, int64_t dim) { return sum / static_cast<float>(dim); }
__device__ inline float layer_rstd(float sum_sq_dev, int64_t dim, float eps) {
  return rsqrtf(sum_sq_dev / static_cast<float>(dim) + eps);
}
__device__ inline float layer_value(float x, float mean, float rstd, float weight, float bias) {
  return (x - mean) * rstd * weight + bias;
}

}  // namespace loom::kernels::cuda
