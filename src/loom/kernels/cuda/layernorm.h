#pragma once
// LayerNorm on the device, with the contracts of kernels::cpu::layernorm_forward / _backward:
//   forward:  out = (in - mean) * rstd * weight + bias, saving mean[row] and rstd[row];
//   backward: din += d(loss)/d(in); dweight, dbias += their gradients (summed per run of rows,
//             the runs in a fixed order: deterministic, the CPU's up to fp32 rounding).
// Forward: a group of threads per row (norm_rows.cuh), the row read once in 16-byte packs and held
// in registers (fp32 sums by warp shuffles). Backward: a block per run of rows (norm_blocks.h),
// no atomics.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                       int64_t rows, int64_t dim, float eps, cudaStream_t stream = nullptr);
// The forward into bf16 (kernels::layernorm_forward_bf16): the same fp32 arithmetic, each output
// rounded to bf16 as it is stored.
void layernorm_forward_bf16(void* out16, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps, cudaStream_t stream = nullptr);
// The statistics alone (mean, rstd), and given `amax` (a device float, amax_into's contract) the
// max |output|, no output written (kernels::norm_statistics): the same arithmetic as the forward.
void layernorm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                          int64_t rows, int64_t dim, float eps, float* amax, cudaStream_t stream = nullptr);
// sum = residual + add16 (the stream's next tensor), then the bf16 forward of sum, in one pass
// (kernels::layernorm_add_forward_bf16): the statistics and outputs layernorm_forward_bf16 gives on sum.
void layernorm_add_forward_bf16(void* out16, float* mean, float* rstd, float* sum, const float* residual,
                                const void* add16, const float* weight, const float* bias, int64_t rows, int64_t dim,
                                float eps, cudaStream_t stream = nullptr);
// din16 (null: none): din after the add rounded to bf16; din_amax (null: none): max |din| after the
// add taken into it (amax_into's contract); both from the same pass (kernels::layernorm_backward).
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16, float* din_amax, cudaStream_t stream = nullptr);
// The same over a bf16 output gradient (kernels::layernorm_backward_bf16): the fp32 form's bits on
// the widened gradient.
void layernorm_backward_bf16(float* din, float* dweight, float* dbias, const void* dout16, const float* in,
                             const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                             void* din16, float* din_amax, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
