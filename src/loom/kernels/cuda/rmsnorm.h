#pragma once
// RMSNorm on the device, with the contracts of kernels::cpu::rmsnorm_forward / _backward:
//   forward:  out = in / rms(in) * weight, rstd[row] = 1 / sqrt(mean(in^2) + eps)
//   backward: din += d(loss)/d(in), dweight += d(loss)/d(weight) (accumulated, as on the CPU).
// Forward: a group of threads per row (norm_rows.cuh), the row read once in 16-byte packs and held
// in registers, its sum by warp shuffles (fp32). Backward: a block per run of rows (norm_blocks.h),
// each thread keeping its columns' weight gradient in registers over the run, the runs added in a
// fixed order: no atomics, the same bits on every run.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                     float eps, cudaStream_t stream = nullptr);
// The forward into bf16 (kernels::rmsnorm_forward_bf16): the same fp32 arithmetic, each output
// rounded to bf16 as it is stored.
void rmsnorm_forward_bf16(void* out16, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                          float eps, cudaStream_t stream = nullptr);
// The statistics alone (rstd), and given `amax` (a device float, amax_into's contract) the max
// |output|, no output written (kernels::norm_statistics): the same arithmetic as the forward.
void rmsnorm_statistics(float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* amax, cudaStream_t stream = nullptr);
// sum = residual + add16 (the stream's next tensor), then the bf16 forward of sum, in one pass
// (kernels::rmsnorm_add_forward_bf16): the statistics and outputs rmsnorm_forward_bf16 gives on sum.
void rmsnorm_add_forward_bf16(void* out16, float* rstd, float* sum, const float* residual, const void* add16,
                              const float* weight, int64_t rows, int64_t dim, float eps, cudaStream_t stream = nullptr);
// din16 (null: none): din after the add rounded to bf16; din_amax (null: none): max |din| after the
// add taken into it (amax_into's contract); both from the same pass (kernels::rmsnorm_backward).
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax,
                      cudaStream_t stream = nullptr);
// The same over a bf16 output gradient (kernels::rmsnorm_backward_bf16): its values widened exactly,
// the fp32 form's arithmetic and order, so the fp32 form's bits on the widened gradient.
void rmsnorm_backward_bf16(float* din, float* dweight, const void* dout16, const float* in, const float* weight,
                           const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax,
                           cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
