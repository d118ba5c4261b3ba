// The vectorisable exp and sigmoid (kernels/cpu/fast_math.h) against libm's: fp32's within its
// stated 2e-7, the double form within an ulp, over the range the kernels feed them and at the
// clamps.
#include "loom/kernels/cpu/fast_math.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace loom::kernels::cpu {
namespace {

TEST(FastMath, DoubleExpIsWithinAnUlpOfLibm) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> wide(-700.0, 700.0), narrow(-1.0, 1.0);
  std::vector<double> x;
  for (int i = 0; i < 200000; ++i) x.push_back(i % 2 ? wide(rng) : narrow(rng));
  // Around the reduction's seams (half-integer multiples of ln 2) and the ends of the range.
  for (int n = -1000; n <= 1000; ++n) {
    const double seam = (n + 0.5) * std::log(2.0);
    for (const double at : {seam, std::nextafter(seam, 0.0), std::nextafter(seam, 1e9)})
      if (std::abs(at) < 708.0) x.push_back(at);
  }
  for (const double at : {0.0, -0.0, 1e-300, -1e-300, 708.0, -708.0, 709.0}) x.push_back(at);
  std::vector<double> fast(x.size());
#pragma omp simd
  for (size_t i = 0; i < x.size(); ++i) fast[i] = fast_exp(x[i]);  // the vector form, as the kernels run it
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(x[i]);
    ASSERT_LE(std::abs(fast[i] - want), want * std::numeric_limits<double>::epsilon()) << "exp(" << x[i] << ")";
    ASSERT_EQ(fast_exp(x[i]), fast[i]) << "scalar and vector forms differ at " << x[i];
  }
}

TEST(FastMath, DoubleExpClampsOutsideTheDoubleRange) {
  EXPECT_EQ(fast_exp(1000.0), fast_exp(709.0));
  EXPECT_TRUE(std::isfinite(fast_exp(1e308)));
  EXPECT_LE(fast_exp(-1000.0), 1e-307);
  EXPECT_GE(fast_exp(-1000.0), 0.0);
  // The sigmoid then saturates cleanly at both ends.
  EXPECT_EQ(fast_sigmoid(1000.0), 1.0);
  EXPECT_LE(fast_sigmoid(-1000.0), 1e-307);
  EXPECT_NEAR(fast_sigmoid(0.0), 0.5, 0.0);
}

TEST(FastMath, FloatExpIsWithinItsStatedError) {
  for (float x = -80.0f; x <= 80.0f; x += 0.01f) {
    const double want = std::exp(static_cast<double>(x));
    ASSERT_LE(std::abs(fast_exp(x) - want), 2e-7 * want) << "expf(" << x << ")";
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
