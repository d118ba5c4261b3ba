#include "loom/kernels/cpu/adamw.h"
#include "loom/kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::kernels::cpu {

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& s) {
  const float bias1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step)));
  const float bias2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step)));
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    float g = s.grad_scale * grad[i];
    float m = s.beta1 * exp_avg[i] + (1.0f - s.beta1) * g;
    float v = s.beta2 * exp_avg_sq[i] + (1.0f - s.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float update = (m / bias1) / (std::sqrt(v / bias2) + s.eps);
    param[i] -= s.lr * (update + s.weight_decay * param[i]);
  }
}

double sum_of_squares(const float* x, int64_t n) {
  // Fixed blocks summed in block order: the result does not depend on thread timing. Each square
  // is exact in fp64 and summed there, so the total hardly depends on how a layout splits the
  // tensor either: the global norms of two layouts agree to fp64 rounding, and with them (almost
  // always bit for bit) their fp32 clip factors.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partials(blocks);
#pragma omp parallel for schedule(static) if(worth_parallel(n))
  for (int64_t block = 0; block < blocks; ++block) {
    int64_t begin = block * kBlock, end = std::min(n, begin + kBlock);
    double partial = 0.0;
#pragma omp simd reduction(+ : partial)
    for (int64_t i = begin; i < end; ++i) partial += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    partials[block] = partial;
  }
  double total = 0.0;
  for (double p : partials) total += p;
  return total;
}

void scale_in_place(float* x, int64_t n, float factor) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

void add_in_place(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void nesterov_outer_update(float* anchor, float* momentum, const float* delta, int64_t n, float lr, float mu) {
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float m = std::fma(mu, momentum[i], delta[i]);
    momentum[i] = m;
    anchor[i] = std::fma(-lr, std::fma(mu, m, delta[i]), anchor[i]);
  }
}

}  // namespace loom::kernels::cpu
