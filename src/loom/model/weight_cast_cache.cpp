#include "loom/model/weight_cast_cache.h"

#include "loom/core/error.h"

namespace loom::model {

void WeightCastCache::open() {
  close();
  open_ = true;
}

void WeightCastCache::free_all() {
  for (auto& [key, store] : stores_) free(store);
  stores_.clear();
}

void WeightCastCache::close() {
  free_all();
  open_ = false;
  copy_values_ = nullptr;
  copy_total_ = 0;
  copy_ = nullptr;
}

void WeightCastCache::use_bf16_copy(const float* values, int64_t total, const void* copy) {
  LOOM_CHECK(open_, "WeightCastCache::use_bf16_copy: outside a step's scope (open() first)");
  copy_values_ = values;
  copy_total_ = total;
  copy_ = copy;
}

const void* WeightCastCache::bf16_copy_of(const float* x, int64_t n) const {
  if (copy_ == nullptr || x == nullptr || x < copy_values_ || x + n > copy_values_ + copy_total_) return nullptr;
  return static_cast<const uint16_t*>(copy_) + (x - copy_values_);
}

void WeightCastCache::free(Store& store) {
  if (store.data != nullptr && !store.borrowed) allocator(device_).free(store.data, static_cast<size_t>(store.bytes));
  store = Store();
}

WeightCastCache::Store& WeightCastCache::store_of(const void* layer, const float* weight, kernels::LinearGemm pass,
                                                  const kernels::CastOperand& cast, Device device) {
  if (device != device_) {  // a model moved: what it kept is on the old device
    free_all();
    device_ = device;
  }
  return stores_[Key{layer, weight, kernels::weight_cast_form(cast.cast, pass)}];
}

namespace {

// What s holds: the weight [rows, cols] cast as `cast` says.
void describe(WeightCastCache::Store& s, const kernels::CastOperand& cast, int64_t rows, int64_t cols) {
  s.cast = cast.cast;
  s.rows = rows;
  s.cols = cols;
  s.scale = cast.scale;
}

// Whether s holds that cast, written: what find() hands back as it is.
bool holds_written(const WeightCastCache::Store& s, const kernels::CastOperand& cast, int64_t rows, int64_t cols) {
  return s.ready && s.cast == cast.cast && s.rows == rows && s.cols == cols && s.scale == cast.scale;
}

}  // namespace

void WeightCastCache::borrow(Store& s, void* data, const kernels::CastOperand& cast, int64_t rows, int64_t cols) {
  free(s);
  s.data = data;
  describe(s, cast, rows, cols);
  s.ready = true;
  s.borrowed = true;
}

void WeightCastCache::lend(const void* layer, const float* weight, kernels::LinearGemm pass,
                           const kernels::CastOperand& cast, int64_t rows, int64_t cols, Device device, void* data) {
  LOOM_CHECK(open_ && !device.is_cpu() && cast.cast != kernels::OperandCast::None,
             "WeightCastCache::lend: a cast store on a device, inside a step's scope");
  borrow(store_of(layer, weight, pass, cast, device), data, cast, rows, cols);
}

bool WeightCastCache::holds(const void* layer, const float* weight, kernels::LinearGemm pass,
                            const kernels::CastOperand& cast, int64_t rows, int64_t cols, Device device) const {
  if (!open_ || device != device_ || cast.cast == kernels::OperandCast::None) return false;
  const auto it = stores_.find(Key{layer, weight, kernels::weight_cast_form(cast.cast, pass)});
  return it != stores_.end() && holds_written(it->second, cast, rows, cols);
}

WeightCastCache::Store* WeightCastCache::find(const void* layer, const float* weight, kernels::LinearGemm pass,
                                              const kernels::CastOperand& cast, int64_t rows, int64_t cols,
                                              Device device) {
  if (!open_ || device.is_cpu() || cast.cast == kernels::OperandCast::None) return nullptr;
  Store& s = store_of(layer, weight, pass, cast, device);
  if (holds_written(s, cast, rows, cols)) return &s;
  const void* copied = cast.cast == kernels::OperandCast::Bf16 ? bf16_copy_of(weight, rows * cols) : nullptr;
  if (copied != nullptr) {
    borrow(s, const_cast<void*>(copied), cast, rows, cols);
    return &s;
  }
  const int64_t bytes = kernels::weight_cast_layout(cast.cast, rows, cols).bytes;
  if (s.data == nullptr || s.bytes != bytes) {
    free(s);
    s.data = allocator(device).allocate(static_cast<size_t>(bytes));
    s.bytes = bytes;
  }
  describe(s, cast, rows, cols);
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
