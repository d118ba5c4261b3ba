#pragma once
// exp and sigmoid written with plain arithmetic so `#pragma omp simd` loops vectorize them
// (libm's expf/tanhf are scalar calls). Cody-Waite range reduction x = n ln2 + r and the
// Cephes minimax polynomial for exp(r) on [-ln2/2, ln2/2]: relative error below 2e-7. The double
// forms (the Mamba-2 kernels' arithmetic) take exp(r)'s Taylor series to r^13 (its remainder is
// below 4e-18 relative there): within one ulp of libm's exp.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::kernels::cpu {

#pragma omp declare simd
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return y * scale;
}

#pragma omp declare simd
inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

#pragma omp declare simd
inline double fast_exp(double x) {
  x = std::min(std::max(x, -708.0), 709.0);
  // Adding 1.5 * 2^52 rounds x / ln2 to the integer n held in the sum's low bits, which then
  // become 2^n's exponent field (two's complement: negative n too), all in vector lanes.
  constexpr double kShifter = 6755399441055744.0;
  const double shifted = x * 1.4426950408889634 + kShifter;
  const double n = shifted - kShifter;
  const double r = (x - n * 6.93147180369123816490e-01) - n * 1.90821492927058770002e-10;
  double p = 1.0 / 6227020800.0;  // 1 / 13!
  for (const double inverse_factorial : {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
                                         1.0 / 40320.0, 1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0,
                                         0.5, 1.0, 1.0})
    p = p * r + inverse_factorial;
  const double scale = std::bit_cast<double>((std::bit_cast<int64_t>(shifted) + 1023) << 52);
  return p * scale;
}

#pragma omp declare simd
inline double fast_sigmoid(double x) { return 1.0 / (1.0 + fast_exp(-x)); }

}  // namespace loom::kernels::cpu
