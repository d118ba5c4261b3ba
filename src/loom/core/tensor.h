#pragma once
// Tensor: an owning, contiguous, row-major block of elements with a dtype, a shape and a device.
// Views into larger buffers (a parameter inside the flat parameter buffer) use `Tensor::view`.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& shape);
std::string shape_string(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-filled storage through the device's allocator (on the host: 64-byte aligned).
  Tensor(Shape shape, DType dtype, Device device = Device::cpu());
  // A host tensor (device cpu, zero-filled) in the memory `device` moves to and from fastest
  // (Allocator::allocate_transfer_staging: page-locked for a GPU), for host arrays that cross the
  // link every step (ZeRO-3's shards under parallel.offload_params, an offloaded optimizer's staging).
  static Tensor transfer_staging(Shape shape, DType dtype, Device device);
  // A non-owning view of `data`, which must outlive the view.
  static Tensor view(void* data, Shape shape, DType dtype, Device device = Device::cpu());

  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t ndim() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool empty() const { return data_ == nullptr; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() { return static_cast<T*>(data_); }
  template <typename T> const T* data() const { return static_cast<const T*>(data_); }

  void zero();

 private:
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_;
  std::shared_ptr<void> storage_;  // null for views
  void* data_ = nullptr;
};

}  // namespace loom
