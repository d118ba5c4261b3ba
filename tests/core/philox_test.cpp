#include <gtest/gtest.h>

#include <cmath>

#include "loom/core/philox.h"
#include "loom/core/tensor.h"

namespace loom {

// Known-answer test from the Random123 distribution (kat_vectors: philox4x32_10).
TEST(Philox, MatchesRandom123KnownAnswers) {
  PhiloxBlock zero = philox4x32(0, 0, 0);
  EXPECT_EQ(zero, (PhiloxBlock{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  PhiloxBlock ones = philox4x32(0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffffffffffull);
  EXPECT_EQ(ones, (PhiloxBlock{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
}

TEST(Philox, ValueDependsOnlyOnKeyAndIndex) {
  uint64_t key = philox_key(7, "model.layers.0.mlp.up_proj.weight");
  float a = philox_normal(key, 123456);
  for (int i = 0; i < 10; ++i) philox_normal(key, i);
  EXPECT_EQ(a, philox_normal(key, 123456));
  EXPECT_NE(key, philox_key(7, "model.layers.1.mlp.up_proj.weight"));
  EXPECT_NE(key, philox_key(8, "model.layers.0.mlp.up_proj.weight"));
}

TEST(Philox, NormalHasUnitMoments) {
  uint64_t key = philox_key(1, "x");
  double sum = 0, sum_sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double v = philox_normal(key, i);
    sum += v;
    sum_sq += v * v;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum_sq / n, 1.0, 0.02);
}

TEST(Tensor, AllocatesZeroedAlignedStorage) {
  Tensor t({3, 5}, DType::BF16);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<uint16_t>()[i], 0);
  EXPECT_THROW(Tensor({-1}, DType::F32), Error);
}

}  // namespace loom
