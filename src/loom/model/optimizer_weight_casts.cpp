#include "loom/model/optimizer_weight_casts.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/model/linear_precision.h"

namespace loom::model {

void OptimizerWeightCasts::enable(Device device) {
  LOOM_CHECK(!device.is_cpu(), "OptimizerWeightCasts: the optimizer writes weight casts on a device only");
  if (enabled_ && device == device_) return;
  entries_.clear();
  slabs_.clear();
  slots_used_ = 0;
  enabled_ = true;
  device_ = device;
}

OptimizerWeightCasts::Entry* OptimizerWeightCasts::want(const LinearPrecision* layer, const float* weight,
                                                        int64_t rows, int64_t cols, bool codes) {
  if (!enabled_) return nullptr;
  std::unique_ptr<Entry>& e = entries_[{layer, weight}];
  if (e != nullptr && e->rows == rows && e->cols == cols && e->codes == codes) return e.get();
  float* amax = e != nullptr ? e->amax : nullptr;  // a reshaped weight keeps its slot
  if (amax == nullptr) {
    if (slots_used_ == static_cast<int64_t>(slabs_.size()) * kSlab) slabs_.emplace_back(device_, kSlab);
    amax = slabs_.back().data() + slots_used_ % kSlab;
    ++slots_used_;
  }
  e = std::make_unique<Entry>();
  e->layer = layer;
  e->weight = weight;
  e->rows = rows;
  e->cols = cols;
  e->codes = codes;
  e->amax = amax;
  if (codes) {
    const auto bytes = [](int64_t r, int64_t c) {
      return kernels::weight_cast_layout(kernels::OperandCast::Fp8Tensor, r, c).bytes;
    };
    e->forward = DeviceBuffer<uint8_t>(device_, bytes(rows, cols));
    e->transposed = DeviceBuffer<uint8_t>(device_, bytes(cols, rows));
  }
  return e.get();
}

std::vector<OptimizerWeightCasts::Entry*> OptimizerWeightCasts::targets() {
  std::vector<Entry*> out;
  for (auto& [key, e] : entries_) {
    if (e->codes) e->scale = e->layer->scale(Operand::Weight);
    out.push_back(e.get());
  }
  for (int64_t s = 0; s * kSlab < slots_used_; ++s) {
    const int64_t n = std::min(kSlab, slots_used_ - s * kSlab);
    allocator(device_).zero(slabs_[static_cast<size_t>(s)].data(), static_cast<size_t>(n) * sizeof(float));
  }
  return out;
}

void OptimizerWeightCasts::written(const std::vector<Entry*>& entries) {
  for (auto& [key, e] : entries_) e->current = false;
  for (Entry* e : entries) e->current = true;
}

void OptimizerWeightCasts::invalidate() {
  for (auto& [key, e] : entries_) e->current = false;
}

}  // namespace loom::model
