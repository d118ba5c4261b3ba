#pragma once
// AdamW (decoupled weight decay, Loshchilov & Hutter) and global-norm gradient clipping over
// flat buffers. Sums of squares accumulate in double in fixed per-thread blocks (deterministic).
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

using kernels::AdamWStep;

// g = grad_scale * grad; param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param)
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step);

// Sum of squares of x[0..n), each square exact in fp64 and summed there (fixed blocks, in order):
// Inf or NaN exactly when some x[i] is.
double sum_of_squares(const float* x, int64_t n);

// x *= factor
void scale_in_place(float* x, int64_t n, float factor);

// y += x
void add_in_place(float* y, const float* x, int64_t n);

// DiLoCo's outer step, SGD with Nesterov momentum on the averaged delta, each line one fused
// multiply-add: momentum = fma(mu, momentum, delta); anchor = fma(-lr, fma(mu, momentum, delta), anchor).
void nesterov_outer_update(float* anchor, float* momentum, const float* delta, int64_t n, float lr, float mu);

}  // namespace loom::kernels::cpu
