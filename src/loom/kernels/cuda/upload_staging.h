#pragma once
// Small host-to-device copies that do not wait for the device. A copy from pageable host memory
// (cudaMemcpyAsync) may synchronise with the stream before it starts, and Allocator::from_host
// then waited for the stream anyway, so every upload of a step's token ids, targets and positions
// let the GPU run dry while the host caught up. Here the host's bytes are copied into a pinned
// slot, the slot's copy to the device is queued on the stream, and the call returns: the caller's
// bytes may be reused at once, which is all from_host promises, and the stream reads the slot in
// its order. Slots are taken in turn, each once its last copy is done (an event, normally long
// passed); copies larger than kMaxStagedBytes (a checkpoint's parameters) keep the waiting path.
// The slots bound how far the host runs ahead of the device in uploads: 8 by default (a step's
// few token uploads), more where uploads are many (grouped GEMMs' pointer arrays, several per layer).
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <vector>

namespace loom::kernels::cuda {

class UploadStaging {
 public:
  static constexpr size_t kMaxStagedBytes = size_t{4} << 20;

  explicit UploadStaging(int device, int slots = 8) : device_(device), slots_(static_cast<size_t>(slots)) {}
  ~UploadStaging();
  UploadStaging(const UploadStaging&) = delete;
  UploadStaging& operator=(const UploadStaging&) = delete;

  // Whether upload() takes a copy of `bytes`.
  static bool takes(size_t bytes) { return bytes > 0 && bytes <= kMaxStagedBytes; }
  // dst (device memory of this device) = src (host memory), in `stream`'s order; returns once src
  // may be reused, without waiting for the stream.
  void upload(void* dst, const void* src, size_t bytes, cudaStream_t stream);

 private:
  struct Slot {
    void* host = nullptr;  // pinned
    size_t bytes = 0;
    cudaEvent_t done = nullptr;  // recorded after the slot's last copy
  };
  int device_;
  std::mutex mutex_;
  std::vector<Slot> slots_;
  int next_ = 0;
};

}  // namespace loom::kernels::cuda
