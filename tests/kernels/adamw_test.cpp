#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "../gradient_check.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/adamw.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cpu {
namespace {

TEST(AdamW, MatchesDoublePrecisionReference) {
  const int64_t n = 1001;
  auto p = loom::testing::random_vector(n, 1), g = loom::testing::random_vector(n, 2);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int64_t step = 1; step <= 3; ++step) {
    adamw_update(p.data(), g.data(), m.data(), v.data(), n,
                 {static_cast<float>(lr), static_cast<float>(b1), static_cast<float>(b2), static_cast<float>(eps),
                  static_cast<float>(wd), step});
    for (int64_t i = 0; i < n; ++i) {
      rm[i] = b1 * rm[i] + (1 - b1) * g[i];
      rv[i] = b2 * rv[i] + (1 - b2) * g[i] * g[i];
      double mhat = rm[i] / (1 - std::pow(b1, step)), vhat = rv[i] / (1 - std::pow(b2, step));
      rp[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * rp[i]);
    }
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(p[i], rp[i], 1e-5 * (1.0 + std::fabs(rp[i])));
}

TEST(AdamW, SumOfSquaresMatchesSerialOnAwkwardSizes) {
  for (int64_t n : {0, 1, 7, 4095, 4096, 4097, 100003}) {
    auto x = loom::testing::random_vector(n, 3);
    double expect = 0.0;
    for (float v : x) expect += static_cast<double>(v) * v;
    EXPECT_NEAR(sum_of_squares(x.data(), n), expect, 1e-12 * (1.0 + expect)) << "n=" << n;
  }
}

// The gradient norm is the precision step's check for a step to skip: the sum is Inf or NaN
// exactly when an element is, and the largest finite floats (whose squares overflow fp32) keep it
// finite.
TEST(AdamW, SumOfSquaresIsNonFiniteExactlyWhenAnElementIs) {
  constexpr float kMax = std::numeric_limits<float>::max();
  for (int64_t n : {1, 4097, 300001}) {
    std::vector<float> x = loom::testing::random_vector(n, 4);
    for (int64_t i = 0; i < n; i += 997) x[static_cast<size_t>(i)] = i % 2 == 0 ? kMax : -kMax;
    const double finite = sum_of_squares(x.data(), n);
    EXPECT_TRUE(std::isfinite(finite)) << n;
    EXPECT_GE(finite, static_cast<double>(kMax) * kMax) << n;
    for (float bad : {INFINITY, -INFINITY, NAN}) {
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        std::vector<float> y = x;
        y[static_cast<size_t>(at)] = bad;
        const double sum = sum_of_squares(y.data(), n);
        EXPECT_FALSE(std::isfinite(sum)) << n << " " << at << " " << bad;
        EXPECT_EQ(std::isnan(sum), std::isnan(bad)) << n << " " << at << " " << bad;
      }
    }
  }
}

TEST(AdamW, AddInPlaceAddsElementByElement) {
  for (int64_t n : {0, 1, 4097, 100003}) {
    auto y = loom::testing::random_vector(n, 5), x = loom::testing::random_vector(n, 6);
    std::vector<float> expect(y.size());
    for (int64_t i = 0; i < n; ++i) expect[i] = y[i] + x[i];
    add_in_place(y.data(), x.data(), n);
    EXPECT_EQ(y, expect) << "n=" << n;
  }
}

// Each tensor with its own step (step_index into the call's steps): a decayed and an undecayed one.
TEST(AdamW, ManyTensorsInOneCallEqualOneCallEach) {
  const std::vector<AdamWStep> steps = {{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 0.5f},
                                        {3e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 4, 0.5f}};
  std::vector<std::vector<float>> p, g, m, v;
  for (int64_t n : {0, 1, 4097, 333}) {
    p.push_back(loom::testing::random_vector(n, 10 + n));
    g.push_back(loom::testing::random_vector(n, 20 + n));
    m.push_back(loom::testing::random_vector(n, 30 + n));
    v.push_back(loom::testing::random_vector(n, 40 + n));
    for (float& x : v.back()) x = std::fabs(x);
  }
  auto p1 = p, m1 = m, v1 = v;
  std::vector<AdamWTensor> tensors;
  for (size_t t = 0; t < p.size(); ++t) {
    tensors.push_back({p[t].data(), g[t].data(), m[t].data(), v[t].data(), static_cast<int64_t>(p[t].size())});
    tensors.back().step_index = static_cast<int>(t % 2);
    adamw_update(p1[t].data(), g[t].data(), m1[t].data(), v1[t].data(), static_cast<int64_t>(p[t].size()),
                 steps[t % 2]);
  }
  kernels::adamw_update_many(Device::cpu(), tensors, steps);
  EXPECT_EQ(p, p1);
  EXPECT_EQ(m, m1);
  EXPECT_EQ(v, v1);
  // A step_index outside the steps given is an error naming it, before anything is updated.
  tensors.back().step_index = 2;
  try {
    kernels::adamw_update_many(Device::cpu(), tensors, steps);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_index 2 outside the 2 steps given"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p, p1);
}

// An FP8 weight's amax (AdamWFp8Weight: what fp8_current's next cast of it takes) is the max |x| of
// the updated values; its codes go to stores in a device's memory, which a CPU run has none of:
// asking for them is an error saying so, before anything is updated.
TEST(AdamW, AnFp8WeightsAmaxIsTheUpdatedMaxAndItsCodesAreTheDevicesOnly) {
  const AdamWStep step{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4, 0.5f};
  std::vector<float> p = loom::testing::random_vector(333, 1), g = loom::testing::random_vector(333, 2);
  std::vector<float> m(333, 0.0f), v(333, 0.0f);
  AdamWTensor t{p.data(), g.data(), m.data(), v.data(), 333};
  float amax = 0.0f;
  t.fp8.amax = &amax;
  kernels::adamw_update_many(Device::cpu(), std::vector<AdamWTensor>{t}, step);
  float want = 0.0f;
  for (float x : p) want = std::max(want, std::fabs(x));
  EXPECT_EQ(amax, want);
  EXPECT_GT(amax, 0.0f);
  const std::vector<float> before = p;
  uint8_t codes[8];
  t.fp8 = {&amax, codes, codes, 111, 3, 1.0f};
  try {
    kernels::adamw_update_many(Device::cpu(), std::vector<AdamWTensor>{t}, step);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a CPU run has none"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p, before);
}

}  // namespace
}  // namespace loom::kernels::cpu
