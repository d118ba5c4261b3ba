#include "loom/parallel/data/shard_memory.h"

#include <cstring>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::parallel {

namespace {

void check_f32_wire(Device device, DType wire) {
  LOOM_CHECK(wire == DType::F32, "ZeRO on " + device.name() + ": gradients travel in f32 there, not " +
                                     dtype_name(wire) + " (precision.grad_reduce=fp32)");
}

}  // namespace

void stage_for_reduce(Device device, std::byte* dst, const float* src, int64_t n, int64_t padded, DType wire) {
  if (device.is_cpu()) {
    const size_t element = dtype_size(wire);
    comm::from_f32(dst, src, n, wire);  // a copy for f32, rounded for bf16
    std::memset(dst + n * element, 0, static_cast<size_t>(padded - n) * element);
    return;
  }
  check_f32_wire(device, wire);
  float* staged = reinterpret_cast<float*>(dst);
  copy_on_device(device, staged, src, n);
  zero_on_device(device, staged + n, padded - n);
}

void take_reduced(Device device, float* dst, const std::byte* received, int64_t n, DType wire, bool accumulate) {
  if (device.is_cpu()) {
    if (accumulate) {
      comm::accumulate(dst, received, n, wire, comm::ReduceOp::Sum);
    } else {
      comm::to_f32(dst, received, n, wire);
    }
    return;
  }
  check_f32_wire(device, wire);
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
