#pragma once
// Activation and scratch buffers: grown on first use for a (batch, seq) and then reused, released
// explicitly. Each is a DeviceBuffer (core/device.h), allocated through its device's allocator;
// .data() is the raw pointer kernels take. A buffer starts empty on the host; the forms taking a
// device (the model's) first move an empty or host buffer there, so modules need not construct
// their many buffers on a device.
#include <cstdint>
#include <vector>

#include "loom/core/device.h"

namespace loom::model {

using Buffer = DeviceBuffer<float>;

// At least n elements (grows, keeping the contents; never shrinks).
template <typename T>
T* sized(DeviceBuffer<T>& buffer, int64_t n) {
  if (buffer.size() < n) [[unlikely]] buffer.resize(n);
  return buffer.data();
}
inline float* zeroed(Buffer& buffer, int64_t n) {
  float* p = sized(buffer, n);
  if (n > 0) allocator(buffer.device()).zero(p, static_cast<size_t>(n) * sizeof(float));
  return p;
}
inline void release(Buffer& buffer) { buffer.release(); }

// The same on `device` (the buffer is remade there, empty, when it lives elsewhere).
template <typename T>
T* sized(DeviceBuffer<T>& buffer, int64_t n, Device device) {
  if (buffer.device() != device) [[unlikely]] buffer = DeviceBuffer<T>(device);
  return sized(buffer, n);
}
inline float* zeroed(Buffer& buffer, int64_t n, Device device) {
  if (buffer.device() != device) [[unlikely]] buffer = Buffer(device);
  return zeroed(buffer, n);
}
// Room for `bytes` bytes (a device's casts kept between GEMMs: FP8 codes and their scales).
inline void* sized_bytes(Buffer& buffer, int64_t bytes, Device device) {
  return sized(buffer, (bytes + 3) / 4, device);
}
// Room for n 16-bit elements (bf16 / fp16 tensors a device keeps).
inline void* sized_16bit(Buffer& buffer, int64_t n, Device device) { return sized_bytes(buffer, 2 * n, device); }

// Token-level batch inputs (ids, targets, positions, documents: host arrays, checked on the host)
// where the kernels of `device` read them: on the cpu the host array itself; on a GPU a copy
// uploaded into the buffer kept here, made right before its use. The upload is ordered after the
// device's earlier work on this thread's queue (compute_queue.h), the queue of every kernel that
// reads the buffer, so one buffer serves every micro-batch; it must not be read from another queue.
class StagedTokens {
 public:
  const int32_t* stage(Device device, const int32_t* host, int64_t n) {
    if (device.is_cpu() || host == nullptr) return host;
    if (buffer_.device() != device || buffer_.size() < n) buffer_ = DeviceBuffer<int32_t>(device, n);
    copy_from_host(device, buffer_.data(), host, n);
    return buffer_.data();
  }

 private:
  DeviceBuffer<int32_t> buffer_;
};

// A host array copied where the kernels of `device` read it (into `buffer`, grown as needed; on
// the cpu a plain copy), ordered as StagedTokens' uploads. Returns the buffer's data.
template <typename T>
T* upload(Device device, DeviceBuffer<T>& buffer, const T* host, int64_t n) {
  T* data = sized(buffer, n, device);
  copy_from_host(device, data, host, n);
  return data;
}
template <typename T>
T* upload(Device device, DeviceBuffer<T>& buffer, const std::vector<T>& host) {
  return upload(device, buffer, host.data(), static_cast<int64_t>(host.size()));
}

// A Mamba-2 mixer's decoding state for one sequence: the convolution's last conv_kernel - 1
// inputs per channel and the scan's state per head (empty = a fresh sequence).
struct MambaCache {
  Buffer window, state;
};

// Gradient scratch shared by all blocks (only one block runs backward at a time).
struct Workspace {
  Buffer d_normed, d_att, d_qkv, d_hidden, d_act;
  Buffer d_residual16;  // the residual stream's gradient in bf16 (model::ResidualGradForReader)
  Buffer d_mixer_proj, d_mixer_conv, d_mixer_scan, d_mixer_gated;  // Mamba-2 mixers
};

}  // namespace loom::model
