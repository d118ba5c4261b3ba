#include "loom/kernels/cpu/amax.h"

#include <cmath>
#include <vector>

#include <omp.h>

#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/parallel.h"

namespace loom::kernels::cpu {

namespace {

// max that lets a NaN through: once the running value is NaN it stays NaN.
inline float nan_max(float running, float value) { return (value > running || value != value) ? value : running; }

float serial_amax(float m, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) m = nan_max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

void amax_into(float* dst, const float* x, int64_t n) {
  if (!worth_parallel(n)) {
    *dst = serial_amax(*dst, x, n);
    return;
  }
  std::vector<float> partial(static_cast<size_t>(omp_get_max_threads()), 0.0f);
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    partial[static_cast<size_t>(t)] = serial_amax(0.0f, x + begin, end - begin);
  }
  float m = *dst;
  for (float p : partial) m = nan_max(m, p);
  *dst = m;
}

void amax_into_bf16(float* dst, const void* x16, int64_t n) {
  const std::vector<float> x = widened_bf16(x16, n);
  amax_into(dst, x.data(), n);
}

}  // namespace loom::kernels::cpu
