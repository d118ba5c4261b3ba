#include "loom/kernels/cuda/upload_staging.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

UploadStaging::~UploadStaging() {
  // At exit the runtime may be gone already: nothing to report then.
  for (Slot& slot : slots_) {
    if (slot.done != nullptr) (void)cudaEventDestroy(slot.done);
    if (slot.host != nullptr) (void)cudaFreeHost(slot.host);
  }
}

void UploadStaging::upload(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[next_];
  next_ = (next_ + 1) % static_cast<int>(slots_.size());
  if (slot.done == nullptr) {
    check_cuda(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming), "cudaEventCreateWithFlags (upload slot)");
  } else {
    check_cuda(cudaEventSynchronize(slot.done), "cudaEventSynchronize (an upload slot's last copy)");
  }
  if (slot.bytes < bytes) {
    if (slot.host != nullptr) check_cuda(cudaFreeHost(slot.host), "cudaFreeHost (upload slot)");
    slot.host = nullptr;
    slot.bytes = 0;
    const size_t size = std::max<size_t>(bytes, size_t{64} << 10);
    check_cuda(cudaHostAlloc(&slot.host, size, cudaHostAllocDefault),
               "cudaHostAlloc (" + std::to_string(size) + " bytes of pinned upload staging, cuda:" +
                   std::to_string(device_) + ")");
    slot.bytes = size;
  }
  std::memcpy(slot.host, src, bytes);
  check_cuda(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync (host to device, staged)");
  check_cuda(cudaEventRecord(slot.done, stream), "cudaEventRecord (upload slot)");
}

}  // namespace loom::kernels::cuda
