#pragma once
// exp and sigmoid written with plain arithmetic so `#pragma omp simd` loops vectorize them
// (libm's expf/tanhf are scalar calls). Cody-Waite range reduction x = n ln2 + r and the
// Cephes minimax polynomial for exp(r) on [-ln2/2, ln2/2]: relative error below 2e-7.
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

}  // namespace loom::kernels::cpu
