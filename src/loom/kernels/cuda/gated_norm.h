#pragma once
// Mamba-2's gated RMSNorm on the device, with the contracts of kernels::cpu (gated_norm.h): one
// warp per (row, group), its sums in double; backward adds into dy, dz and dweight, the weight's
// gradient summed over row slices and then the slices in order (slice_sums.h), so deterministic.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void gated_rmsnorm_forward(float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                           const float* weight, int64_t rows, int64_t dim, int64_t group_size, float eps,
                           cudaStream_t stream = nullptr);
void gated_rmsnorm_backward(float* dy, float* dz, float* dweight, const float* dout, const float* y, const float* z,
                            int64_t z_stride, const float* weight, const float* rstd, int64_t rows, int64_t dim,
                            int64_t group_size, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
