#include "loom/core/tensor.h"

#include <algorithm>
#include <cstring>

namespace loom {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor::Tensor(Shape shape, DType dtype, Device device)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  for (int64_t d : shape_) LOOM_CHECK(d >= 0, "Tensor: negative dimension in shape " + shape_string(shape_));
  Allocator& a = allocator(device);
  const size_t bytes = std::max<size_t>(nbytes(), 1);  // an allocated tensor is never empty()
  void* p = a.allocate(bytes);
  a.zero(p, bytes);
  storage_ = std::shared_ptr<void>(p, [&a, bytes](void* q) { a.free(q, bytes); });
  data_ = p;
}

Tensor Tensor::transfer_staging(Shape shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  for (int64_t d : t.shape_) LOOM_CHECK(d >= 0, "Tensor: negative dimension in shape " + shape_string(t.shape_));
  Allocator& a = allocator(device);
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  void* p = a.allocate_transfer_staging(bytes);
  std::memset(p, 0, bytes);
  t.storage_ = std::shared_ptr<void>(p, [&a, bytes](void* q) { a.free_transfer_staging(q, bytes); });
  t.data_ = p;
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  return t;
}

void Tensor::zero() {
  if (data_ != nullptr && nbytes() > 0) allocator(device_).zero(data_, nbytes());
}

}  // namespace loom
