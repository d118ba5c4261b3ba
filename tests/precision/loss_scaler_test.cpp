// Dynamic loss scaling: agreement over ranks (threads backend, 4 ranks),
// back-off and skip on overflow, growth after the interval, the min/max clamps, checkpoint state,
// and the disabled scaler of bf16 / fp32 recipes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/precision/loss_scaler.h"
#include "support/thread_ranks.h"

namespace loom::precision {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using loom::testing::threads;

// An Inf on one rank's gradients: every rank skips the step and halves its scale; the next
// clean step is taken everywhere and the scales stay equal.
TEST(LossScaler, OverflowOnOneRankSkipsOnEveryRank) {
  constexpr int kRanks = 4;
  std::mutex mutex;
  std::vector<std::vector<LossScaleDecision>> decisions(kRanks);
  std::vector<std::vector<float>> scales(kRanks);
  comm::launch(threads(kRanks), [&](comm::Communicator& world) {
    DynamicLossScaler scaler;  // 65536, growth interval 2000
    std::vector<float> grads(5000, 0.25f);
    std::vector<LossScaleDecision> mine;
    std::vector<float> my_scales;
    for (int step = 0; step < 3; ++step) {
      // Step 1: rank 2's gradients overflow.
      grads[123] = (step == 1 && world.rank() == 2) ? kInf : 0.25f;
      const bool found = std::any_of(grads.begin(), grads.end(), [](float g) { return !std::isfinite(g); });
      mine.push_back(scaler.update(found, world));
      my_scales.push_back(scaler.scale());
    }
    std::lock_guard<std::mutex> lock(mutex);
    decisions[static_cast<size_t>(world.rank())] = mine;
    scales[static_cast<size_t>(world.rank())] = my_scales;
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(decisions[r].size(), 3u);
    EXPECT_FALSE(decisions[r][0].skip_step) << r;
    EXPECT_TRUE(decisions[r][1].skip_step) << r;
    EXPECT_TRUE(decisions[r][1].found_non_finite) << r;
    EXPECT_FALSE(decisions[r][2].skip_step) << r;
    EXPECT_EQ(scales[r], (std::vector<float>{65536.0f, 32768.0f, 32768.0f})) << r;
  }
}

TEST(LossScaler, GrowsAfterIntervalOfCleanSteps) {
  LossScalerConfig config;
  config.initial_scale = 1024.0f;
  config.growth_interval = 3;
  DynamicLossScaler scaler(config);
  const bool overflow_at[] = {false, false, false, false, false, true, false, false, false};
  const float expected[] = {1024, 1024, 2048, 2048, 2048, 1024, 1024, 1024, 2048};
  for (int i = 0; i < 9; ++i) {
    const LossScaleDecision d = scaler.update(overflow_at[i]);
    EXPECT_EQ(d.skip_step, overflow_at[i]) << i;
    EXPECT_EQ(scaler.scale(), expected[i]) << i;
  }
  // Growth on 4 ranks too: the clean flags agree, every rank grows at the same step.
  std::mutex mutex;
  std::vector<float> final_scales;
  comm::launch(threads(4), [&](comm::Communicator& world) {
    DynamicLossScaler s(config);
    for (int i = 0; i < 6; ++i) s.update(false, world);
    std::lock_guard<std::mutex> lock(mutex);
    final_scales.push_back(s.scale());
  });
  EXPECT_EQ(final_scales, (std::vector<float>(4, 4096.0f)));
}

TEST(LossScaler, ClampsToMinAndMax) {
  LossScalerConfig config;
  config.initial_scale = 4096.0f;
  config.min_scale = 1024.0f;
  config.max_scale = 8192.0f;
  config.growth_interval = 1;
  DynamicLossScaler scaler(config);
  for (int i = 0; i < 5; ++i) scaler.update(true);
  EXPECT_EQ(scaler.scale(), 1024.0f);
  for (int i = 0; i < 10; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 8192.0f);
  LossScalerConfig bad = config;
  bad.backoff_factor = 1.5f;
  EXPECT_THROW(DynamicLossScaler{bad}, Error);
  bad = config;
  bad.initial_scale = kInf;
  EXPECT_THROW(DynamicLossScaler{bad}, Error);
}

// Saving mid-interval and restoring into a fresh scaler continues exactly.
TEST(LossScaler, StateRoundTrips) {
  LossScalerConfig config;
  config.initial_scale = 512.0f;
  config.growth_interval = 4;
  DynamicLossScaler a(config);
  for (bool overflow : {false, true, false, false}) a.update(overflow);
  const LossScalerState saved = a.state();
  EXPECT_EQ(saved.scale, 256.0f);
  EXPECT_EQ(saved.clean_steps, 2);
  DynamicLossScaler b(config);
  b.restore(saved);
  for (bool overflow : {false, false, false, true, false, false, false, false}) {
    a.update(overflow);
    b.update(overflow);
    ASSERT_EQ(a.scale(), b.scale());
    ASSERT_EQ(a.state().clean_steps, b.state().clean_steps);
  }
  EXPECT_EQ(b.scale(), 512.0f);  // grew to 512 after 2 more clean steps, backed off, grew again
  EXPECT_THROW(b.restore({0.0f, 0}), Error);
  EXPECT_THROW(b.restore({kNan, 0}), Error);
}

// bf16 / fp32: scale stays 1 and no step is skipped, but non-finite gradients are still reported.
TEST(LossScaler, DisabledNeverScalesOrSkips) {
  DynamicLossScaler scaler = DynamicLossScaler::disabled();
  EXPECT_FALSE(scaler.enabled());
  for (int i = 0; i < 5; ++i) {
    const LossScaleDecision d = scaler.update(i == 2);
    EXPECT_FALSE(d.skip_step);
    EXPECT_EQ(d.found_non_finite, i == 2);
    EXPECT_EQ(scaler.scale(), 1.0f);
  }
  std::mutex mutex;
  std::vector<bool> found;
  comm::launch(threads(4), [&](comm::Communicator& world) {
    DynamicLossScaler s = DynamicLossScaler::disabled();
    const LossScaleDecision d = s.update(world.rank() == 3, world);
    std::lock_guard<std::mutex> lock(mutex);
    found.push_back(d.found_non_finite && !d.skip_step && s.scale() == 1.0f);
  });
  EXPECT_EQ(found, std::vector<bool>(4, true));
}

}  // namespace
}  // namespace loom::precision
