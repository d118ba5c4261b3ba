#pragma once
// The model's parameters kept in the compute dtype (bf16 or fp16: 2 bytes each) between uses:
// precision.param_dtype=compute at ZeRO 0-2. The fp32 values buffer the model computes from holds
// a unit's parameters only while the unit runs: they are widened from the compact store just
// before the unit's forward and again before its backward, and released after (their pages
// returned to the operating system). The master weights stay fp32 in the optimizer, which writes
// its rounded update into the store. So the persistent parameter state is 2 bytes per parameter,
// which with fp32 gradients, master weights and Adam moments gives Megatron's 18 bytes per
// parameter (6 + 12/d with the distributed optimizer over d ranks). The values and the store live
// on the model's device; the released values are decommitted there (core/device.h: pages on the
// host, granules on a GPU) and committed again before their widening, which is a kernels entry,
// so on a GPU the host never touches them.
#include <cstdint>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/dtype.h"
#include "loom/parallel/data/grad_buckets.h"

namespace loom::parallel {

class CompactParameters {
 public:
  // `values`: the model's fp32 parameter buffer of `total` elements, holding the initial values
  // now; `units`: the flat ranges each unit reads. `store`: the compact copy (`total` elements of
  // `dtype`), owned by the caller (a distributed optimizer gathers into it). Both on `device`.
  // Fills the store from `values` and releases the values.
  CompactParameters(float* values, int64_t total, DType dtype, std::byte* store, std::vector<std::vector<FlatRange>> units,
                    Device device = Device::cpu());

  // Around each unit's forward or backward.
  void materialize(int unit);
  void release(int unit);
  // Widens / releases the whole buffer (checkpoint load, tests).
  void materialize_all();
  void release_all();
  // The values buffer was written whole (a checkpoint was loaded into it): store it, release it.
  void store_from_values();

  int64_t total() const { return total_; }
  DType dtype() const { return dtype_; }
  // Elements of the values buffer resident now, and at most so far.
  int64_t resident() const { return resident_; }
  int64_t peak_resident() const { return peak_resident_; }

 private:
  Device device_;
  float* values_;
  int64_t total_;
  DType dtype_;
  std::byte* store_;
  std::vector<std::vector<FlatRange>> units_;
  std::vector<int> holders_;  // per unit: materializations not yet released
  int64_t resident_ = 0, peak_resident_ = 0;
};

}  // namespace loom::parallel
