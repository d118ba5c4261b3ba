#include "loom/core/tensor.h"

#include <cstdlib>
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
  LOOM_CHECK(device == Device::CPU, "Tensor: only CPU storage is allocated by the core layer");
  for (int64_t d : shape_) LOOM_CHECK(d >= 0, "Tensor: negative dimension in shape " + shape_string(shape_));
  size_t bytes = nbytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  LOOM_CHECK(p != nullptr, "Tensor: out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded == 0 ? 64 : rounded);
  storage_ = std::shared_ptr<void>(p, std::free);
  data_ = p;
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
  if (data_ != nullptr) std::memset(data_, 0, nbytes());
}

}  // namespace loom
