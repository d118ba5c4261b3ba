#pragma once
// LayerNorm on the device, with the contracts of kernels::cpu::layernorm_forward / _backward:
//   forward:  out = (in - mean) * rstd * weight + bias, saving mean[row] and rstd[row];
//   backward: din += d(loss)/d(in); dweight, dbias += their gradients (summed over rows with
//             atomic adds, so in a varying order: the CPU's up to fp32 rounding).
// One block per row; the row's sums are reduced in shared memory (fp32).
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                       int64_t rows, int64_t dim, float eps, cudaStream_t stream = nullptr);
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
