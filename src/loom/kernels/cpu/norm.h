#pragma once
// RMSNorm (Llama) and LayerNorm (GPT-2) over the last dimension. Forward saves per-row
// statistics for backward; backward adds into din, dweight and dbias (see linear.h).
#include <cstdint>

namespace loom::kernels::cpu {

// out = in / rms(in) * weight;  rstd[row] = 1 / sqrt(mean(in^2) + eps)
void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t dim, float eps);
// `din16`, when given: din after the add, rounded to bf16; `din_amax`, when given: max |din| after
// the add taken into it (kernels::rmsnorm_backward).
void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t dim, void* din16 = nullptr,
                      float* din_amax = nullptr);

// out = (in - mean) * rstd * weight + bias
void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t dim, float eps);
void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16 = nullptr, float* din_amax = nullptr);

// The forwards into bf16 (kernels::rmsnorm_forward_bf16): the fp32 forward's values, rounded.
void rmsnorm_forward_bf16(void* out16, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                          float eps);
void layernorm_forward_bf16(void* out16, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps);
// A residual add, then the forward into bf16 (kernels::rmsnorm_add_forward_bf16): the two apart.
void rmsnorm_add_forward_bf16(void* out16, float* rstd, float* sum, const float* residual, const void* add16,
                              const float* weight, int64_t rows, int64_t dim, float eps);
void layernorm_add_forward_bf16(void* out16, float* mean, float* rstd, float* sum, const float* residual,
                                const void* add16, const float* weight, const float* bias, int64_t rows, int64_t dim,
                                float eps);
// The backwards over a bf16 output gradient (kernels::rmsnorm_backward_bf16): the fp32 backward on
// its values widened.
void rmsnorm_backward_bf16(float* din, float* dweight, const void* dout16, const float* in, const float* weight,
                           const float* rstd, int64_t rows, int64_t dim, void* din16 = nullptr,
                           float* din_amax = nullptr);
void layernorm_backward_bf16(float* din, float* dweight, float* dbias, const void* dout16, const float* in,
                             const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                             void* din16 = nullptr, float* din_amax = nullptr);

}  // namespace loom::kernels::cpu
