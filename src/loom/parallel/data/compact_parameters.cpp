#include "loom/parallel/data/compact_parameters.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data/shard_memory.h"

namespace loom::parallel {

CompactParameters::CompactParameters(float* values, int64_t total, DType dtype, std::byte* store,
                                     std::vector<std::vector<FlatRange>> units, Device device)
    : device_(device), values_(values), total_(total), dtype_(dtype), store_(store), units_(std::move(units)) {
  LOOM_CHECK(dtype == DType::BF16 || dtype == DType::F16, "CompactParameters: parameters are kept in bf16 or f16");
  holders_.assign(units_.size(), 0);
  store_from_values();
}

void CompactParameters::store_from_values() {
  kernels::narrow_floats(device_, store_, values_, total_, dtype_);
  release_all();
}

void CompactParameters::materialize(int unit) {
  if (holders_.at(unit)++ > 0) return;
  const size_t element = dtype_size(dtype_);
  for (const FlatRange& r : units_[unit]) {
    commit_range(device_, values_, r.begin, r.size());
    kernels::widen_floats(device_, values_ + r.begin, store_ + r.begin * element, r.size(), dtype_, false);
    resident_ += r.size();
  }
  peak_resident_ = std::max(peak_resident_, resident_);
}

void CompactParameters::release(int unit) {
  LOOM_CHECK(holders_.at(unit) > 0, "CompactParameters: unit " + std::to_string(unit) + " released more often than used");
  if (--holders_[unit] > 0) return;
  for (const FlatRange& r : units_[unit]) {
    release_range(device_, values_, r.begin, r.size());
    resident_ -= r.size();
  }
}

void CompactParameters::materialize_all() {
  commit_range(device_, values_, 0, total_);
  kernels::widen_floats(device_, values_, store_, total_, dtype_, false);
  resident_ = total_;
  peak_resident_ = std::max(peak_resident_, resident_);
}

void CompactParameters::release_all() {
  release_range(device_, values_, 0, total_);
  std::fill(holders_.begin(), holders_.end(), 0);
  resident_ = 0;
}

}  // namespace loom::parallel
