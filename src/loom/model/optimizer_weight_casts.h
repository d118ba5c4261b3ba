#pragma once
// What the optimizer's pass writes of the per-tensor FP8 weights for the next step's products, on
// a device: each weight's amax (the max |value| of what it updates) and, under fp8_delayed, whose
// scale the amax history fixes before the update, the weight's E4M3 codes in both orientations
// with their scale pairs, as the weight's two stores in the weight cast cache hold them
// (kernels::AdamWFp8Weight; Transformer Engine's FP8 weights written by its fused Adam). A
// forward then reads them instead of reading the fp32 weight again: fp8_current's weight is cast
// with no amax pass before it, fp8_delayed's is not cast at all.
//
// A layer's first forward inside a step's scope asks for its weight (want()); the next update
// writes every entry asked for (targets(), then written()), and from then the layer's forwards use
// it while it is current: written by the last update, nothing else having written the values since
// (a checkpoint's load and DiLoCo's outer step call invalidate()). A skipped update writes nothing
// and changes no value, so what was current stays so; codes are used only under the scale they
// were written with (after a skipped step the history may have moved: the layer casts again).
//
// Kept only where the data-parallel stage can write it (parallel::keeps_fp8_weight_casts: ZeRO 0,
// fp32 parameters, a device, a per-tensor FP8 recipe), which enable()s it; disabled, want() keeps
// nothing. Memory: a float per weight, and under fp8_delayed its two stores (2 bytes per weight
// element, which the weight cast cache would otherwise hold during each step).
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "loom/core/device.h"

namespace loom::model {

class LinearPrecision;

class OptimizerWeightCasts {
 public:
  struct Entry {
    const LinearPrecision* layer = nullptr;
    const float* weight = nullptr;
    int64_t rows = 0, cols = 0;
    bool codes = false;        // fp8_delayed: the stores too
    float* amax = nullptr;     // device float (a slab's slot)
    DeviceBuffer<uint8_t> forward, transposed;  // the stores (weight_cast_layout bytes each), when codes
    float scale = 0.0f;        // the codes' scale, when written
    bool current = false;
  };

  // Entries are kept from now on, on `device`.
  void enable(Device device);
  bool enabled() const { return enabled_; }

  // `layer`'s weight [rows, cols] at `weight` (its codes too where `codes`): its entry, made on the
  // first ask (not current until an update writes it); null where disabled.
  Entry* want(const LinearPrecision* layer, const float* weight, int64_t rows, int64_t cols, bool codes);
  // For the optimizer's pass: every entry, each to be written with its layer's weight scale now
  // (the step's history committed). Their amaxes are zeroed here, in stream order.
  std::vector<Entry*> targets();
  // After the pass: the entries it wrote (their codes under `scale`) are current, the others not.
  void written(const std::vector<Entry*>& entries);
  // The values were written by something other than an update: nothing is current.
  void invalidate();

 private:
  static constexpr int64_t kSlab = 256;  // amaxes per slab: one zeroing per slab and update
  bool enabled_ = false;
  Device device_ = Device::cpu();
  std::map<std::pair<const LinearPrecision*, const float*>, std::unique_ptr<Entry>> entries_;
  std::vector<DeviceBuffer<float>> slabs_;
  int64_t slots_used_ = 0;
};

}  // namespace loom::model
