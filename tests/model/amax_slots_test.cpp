// fp8_current's amax floats (model/amax_slots.h) on the emulated CUDA device: each hand-out is a
// zeroed float of its own, a float keeps what was taken into it for the next kHalf hand-outs, and
// the floats are zeroed a half of the ring per launch, not one launch per amax.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "loom/core/device.h"
#include "loom/model/amax_slots.h"
#include "support/emulated_cuda.h"

namespace loom::model {
namespace {

constexpr Device kDevice = Device::cuda(0);
constexpr int64_t kHalf = AmaxSlots::kHalf;

float read(float* slot) {
  float value = -1.0f;
  copy_to_host(kDevice, &value, slot, 1);
  return value;
}

void write(float* slot, float value) { copy_from_host(kDevice, slot, &value, 1); }

TEST(AmaxSlots, EachAmaxGetsAZeroedFloatKeptForTheNextHalfOfTheRing) {
  testing::install_emulated_cuda();
  AmaxSlots slots;
  testing::reset_emulated_census();
  // Four laps of the ring, each float written as an amax producer would after it was handed out.
  std::vector<float*> handed;
  for (int64_t i = 0; i < 8 * kHalf; ++i) {
    float* slot = slots.next(kDevice);
    EXPECT_EQ(read(slot), 0.0f) << "hand-out " << i;
    write(slot, static_cast<float>(i + 1));
    handed.push_back(slot);
    // The float handed out kHalf - 1 hand-outs before still holds its amax.
    if (i >= kHalf - 1) {
      EXPECT_EQ(read(handed[static_cast<size_t>(i - (kHalf - 1))]), static_cast<float>(i - kHalf + 2))
          << "hand-out " << i;
    }
  }
  // 2 x kHalf floats, each its own until the ring comes round.
  const std::set<float*> distinct(handed.begin(), handed.begin() + 2 * kHalf);
  EXPECT_EQ(static_cast<int64_t>(distinct.size()), 2 * kHalf);
  EXPECT_EQ(handed[2 * kHalf], handed[0]);
  // One zeroing per half entered (the ring's allocation zeroes it too), none per amax.
  EXPECT_LE(testing::emulated_census().zeroes, 8 + 1);
}

}  // namespace
}  // namespace loom::model
