#pragma once
// Finite-difference gradient checks shared by the kernel and model tests.
// Central differences in float32 parameters with the loss accumulated in double; tolerance
// |analytic - numeric| <= atol + rtol * max(|analytic|, |numeric|).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace loom::testing {

inline std::vector<float> random_vector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline double weighted_sum(const float* y, const float* w, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(y[i]) * w[i];
  return s;
}

struct FdTolerance {
  double eps = 1e-2;
  double atol = 1e-4;
  double rtol = 1e-2;
  int max_checks = 48;  // entries checked per tensor (spread over the tensor)
};

// Checks analytic[i] against (loss(x + eps e_i) - loss(x - eps e_i)) / (2 eps) for a spread of i.
inline void expect_gradient_matches(const std::string& what, float* x, int64_t n, const float* analytic,
                                    const std::function<double()>& loss, FdTolerance tol = {}) {
  int64_t stride = std::max<int64_t>(1, n / tol.max_checks);
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; i += stride) {
    const float saved = x[i];
    x[i] = saved + static_cast<float>(tol.eps);
    const double plus = loss();
    x[i] = saved - static_cast<float>(tol.eps);
    const double minus = loss();
    x[i] = saved;
    const double numeric = (plus - minus) / (2.0 * tol.eps);
    const double a = analytic[i];
    const double bound = tol.atol + tol.rtol * std::max(std::fabs(a), std::fabs(numeric));
    if (!(std::fabs(a - numeric) <= bound)) {  // a NaN on either side fails too
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: analytic " << a << " vs finite difference " << numeric;
    }
  }
}

}  // namespace loom::testing
