#include "loom/model/weight_cast_cache.h"

namespace loom::model {

void WeightCastCache::open() {
  close();
  open_ = true;
}

void WeightCastCache::close() {
  for (auto& [key, store] : stores_) free(store);
  stores_.clear();
  open_ = false;
}

void WeightCastCache::free(Store& store) {
  if (store.data != nullptr) allocator(device_).free(store.data, static_cast<size_t>(store.bytes));
  store = Store();
}

WeightCastCache::Store* WeightCastCache::find(const void* layer, const float* weight, kernels::LinearGemm pass,
                                              const kernels::CastOperand& cast, int64_t rows, int64_t cols,
                                              Device device) {
  if (!open_ || device.is_cpu() || cast.cast == kernels::OperandCast::None) return nullptr;
  if (device != device_) {  // a model moved: what it kept is on the old device
    close();
    open_ = true;
    device_ = device;
  }
  Store& s = stores_[Key{layer, weight, kernels::weight_cast_form(cast.cast, pass)}];
  if (s.ready && s.cast == cast.cast && s.rows == rows && s.cols == cols && s.scale == cast.scale) return &s;
  const int64_t bytes = kernels::weight_cast_layout(cast.cast, rows, cols).bytes;
  if (s.data == nullptr || s.bytes != bytes) {
    free(s);
    s.data = allocator(device).allocate(static_cast<size_t>(bytes));
    s.bytes = bytes;
  }
  s.cast = cast.cast;
  s.rows = rows;
  s.cols = cols;
  s.scale = cast.scale;
  s.ready = false;
  ++casts_made_;
  return &s;
}

int64_t WeightCastCache::bytes_held() const {
  int64_t total = 0;
  for (const auto& [key, store] : stores_) total += store.bytes;
  return total;
}

}  // namespace loom::model
