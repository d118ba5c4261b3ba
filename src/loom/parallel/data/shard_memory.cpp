#include "loom/parallel/data/shard_memory.h"

#include "loom/kernels/ops.h"

namespace loom::parallel {

void stage_for_reduce(Device device, std::byte* dst, const float* src, int64_t n, int64_t padded, DType wire) {
  const size_t element = dtype_size(wire);
  if (wire == DType::F32) {
    copy_on_device(device, reinterpret_cast<float*>(dst), src, n);
  } else {
    kernels::narrow_floats(device, dst, src, n, wire);  // rounded to nearest even
  }
  allocator(device).zero(dst + n * element, static_cast<size_t>(padded - n) * element);
}

void take_reduced(Device device, float* dst, const std::byte* received, int64_t n, DType wire, bool accumulate) {
  if (wire != DType::F32) return kernels::widen_floats(device, dst, received, n, wire, accumulate);
  const float* shard = reinterpret_cast<const float*>(received);
  if (accumulate) {
    kernels::add_in_place(device, dst, shard, n);
  } else {
    copy_on_device(device, dst, shard, n);
  }
}

void release_range(Device device, float* base, int64_t begin, int64_t numel) {
  if (numel > 0) allocator(device).decommit(base + begin, static_cast<size_t>(numel) * sizeof(float));
}

void commit_range(Device device, float* base, int64_t begin, int64_t numel) {
  if (numel > 0) allocator(device).commit(base + begin, static_cast<size_t>(numel) * sizeof(float));
}

}  // namespace loom::parallel
