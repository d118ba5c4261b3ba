#pragma once
// fp8_current on a device: the floats into which kernels take their operands' amaxes
// (kernels::amax_into's contract: a float zeroed before), shared by a model's linear layers.
// Each amax gets a float of its own, handed out in turn from a ring of two halves; entering a half
// zeroes it whole, in stream order, so a step zeroes its amaxes in a launch per kHalf of them
// rather than one each. A float handed out keeps what its producer took for the next kHalf
// hand-outs: far more than lie between an amax's producer and the last GEMM reading it (the same
// layer's forward, or its dgrad and wgrad).
#include <cstdint>

#include "loom/model/buffers.h"

namespace loom::model {

class AmaxSlots {
 public:
  static constexpr int64_t kHalf = 256;

  // A float for one amax on `device`, zeroed.
  float* next(Device device) {
    if (floats_.device() != device || floats_.size() == 0) {
      floats_ = Buffer(device, 2 * kHalf);
      next_ = 0;
    }
    if (next_ % kHalf == 0) zero_on_device(device, floats_.data() + next_, kHalf);
    float* slot = floats_.data() + next_;
    next_ = (next_ + 1) % (2 * kHalf);
    return slot;
  }

 private:
  Buffer floats_;
  int64_t next_ = 0;
};

}  // namespace loom::model
