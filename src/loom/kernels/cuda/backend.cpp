#include "loom/kernels/cuda/backend.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/entries.h"
#include "loom/kernels/cuda/releasable_memory.h"
#include "loom/kernels/cuda/stream_event.h"
#include "loom/kernels/cuda/upload_staging.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::kernels::cuda {

namespace {

// One GPU's memory for the core layer's registry: the caching allocator, made thread-safe (ranks
// may be threads), with the device made current around every call; releasable memory (the
// model's flat buffers, which ZeRO 2 and 3 decommit range by range) through virtual memory
// management (releasable_memory.h), made when first asked for.
bool vmm_allowed() {
  const char* value = std::getenv("LOOM_CUDA_VMM");
  return value == nullptr || std::string(value) != "0";
}

// A fence on a compute stream: an event recorded there.
class StreamFence final : public DeviceFence {
 public:
  explicit StreamFence(cudaStream_t stream) : event_(stream) {}
  void wait() override { event_.wait(); }

 private:
  StreamEvent event_;
};

class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    void* p = nullptr;
    try {
      p = cache_.allocate(bytes, compute_stream(index_));
    } catch (const Error&) {
      // Out of memory, maybe: the chunks of decommitted granules still waiting to go, first.
      if (!releasable_ || !releasable_->free_pending()) throw;
      p = cache_.allocate(bytes, compute_stream(index_));
    }
    count_allocation(bytes);
    return p;
  }
  // Where virtual memory management is switched off (LOOM_CUDA_VMM=0) or fails, ordinary memory
  // (said once on stderr): decommit then zeroes, as the default Allocator does, and saves nothing.
  void* allocate_releasable(size_t bytes) override {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    if (vmm_usable_) {
      try {
        if (!releasable_) releasable_ = std::make_unique<ReleasableMemory>(index_);
        void* p = releasable_->allocate(bytes);
        count_allocation(bytes);
        return p;
      } catch (const Error& e) {
        vmm_usable_ = false;
        std::fprintf(stderr, "cuda:%d: releasable memory is unavailable (%s); ZeRO 2 and 3 zero released ranges "
                     "instead of giving them back\n", index_, e.what());
      }
    }
    void* p = cache_.allocate(bytes, compute_stream(index_));
    count_allocation(bytes);
    return p;
  }
  // Page-locked, so that the copies through it run at the link's rate (portable: any device's).
  void* allocate_transfer_staging(size_t bytes) override {
    if (bytes == 0) return nullptr;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    void* p = nullptr;
    check_cuda(cudaHostAlloc(&p, bytes, cudaHostAllocPortable),
               "cudaHostAlloc (" + std::to_string(bytes) + " bytes of pinned transfer staging)");
    return p;
  }
  void free_transfer_staging(void* ptr, size_t bytes) override {
    (void)bytes;
    if (ptr != nullptr) cudaFreeHost(ptr);
  }
  // On the compute stream without a wait: from pinned staging the copy engine runs while the host
  // goes on (the caller waits for a fence before touching the host side).
  void to_host_async(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, compute_stream(index_)),
               "cudaMemcpyAsync (device to host, not waited for)");
  }
  void from_host_async(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, compute_stream(index_)),
               "cudaMemcpyAsync (host to device, not waited for)");
  }
  std::unique_ptr<DeviceFence> fence() override {
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    return std::make_unique<StreamFence>(compute_stream(index_));
  }
  void free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    size_t decommitted = 0;
    // Unmapping waits for this device: it must be the current one.
    if (releasable_) check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    if (releasable_ && releasable_->free(ptr, decommitted)) {
      count_free(bytes - decommitted);
      return;
    }
    cache_.release(ptr, compute_stream(index_));
    count_free(bytes);
  }
  void decommit(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    if (releasable_ == nullptr || !releasable_->holds(ptr)) {  // ordinary memory (above)
      check_cuda(cudaMemsetAsync(ptr, 0, bytes, compute_stream(index_)), "cudaMemsetAsync");
      return;
    }
    count_free(releasable_->decommit(ptr, bytes, compute_stream(index_)));
  }
  void commit(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (releasable_ == nullptr || !releasable_->holds(ptr)) return;  // ordinary memory: zeroed at decommit
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    count_allocation(releasable_->commit(ptr, bytes, compute_stream(index_)));
  }
  void zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaMemsetAsync(ptr, 0, bytes, compute_stream(index_)), "cudaMemsetAsync");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_stream(index_)),
               "cudaMemcpyAsync");
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) override {
    if (width == 0 || rows == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                 compute_stream(index_)),
               "cudaMemcpy2DAsync");
  }
  // Pageable host memory: the copy is staged, so it waits for the stream's earlier work and
  // returns once the host side may be read (to_host) or reused (from_host, above UploadStaging's
  // size).
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    transfer(host_dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync (device to host)");
  }
  // A small upload goes through pinned staging and does not wait (upload_staging.h).
  void from_host(void* dst, const void* host_src, size_t bytes) override {
    if (UploadStaging::takes(bytes)) {
      check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
      uploads_.upload(dst, host_src, bytes, compute_stream(index_));
      return;
    }
    transfer(dst, host_src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync (host to device)");
  }
  void synchronize() override {
    const cudaStream_t stream = made_compute_stream(index_);
    if (stream == nullptr) return;  // this thread's queue never ran anything here
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (compute stream)");
    // The chunks this stream's decommits released go back now (ReleasableMemory: they wait for
    // the work queued before each decommit).
    std::lock_guard<std::mutex> lock(mutex_);
    if (releasable_) releasable_->collect();
  }
  size_t alignment() const override { return 256; }
  Device device() const override { return Device::cuda(index_); }
  // The runtime knows every allocation's range (interior pointers too); a host pointer is
  // unregistered memory, not an error.
  bool holds(const void* ptr) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (releasable_ && releasable_->holds(ptr)) return true;
    }
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice && attributes.device == index_;
  }

 private:
  void transfer(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (bytes == 0) return;
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    const cudaStream_t stream = compute_stream(index_);
    check_cuda(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (after a host transfer)");
  }

  int index_;
  mutable std::mutex mutex_;
  CachingAllocator cache_;
  UploadStaging uploads_{index_};
  std::unique_ptr<ReleasableMemory> releasable_;
  bool vmm_usable_ = vmm_allowed();
};

// A few kernels take small scratch in stream order (cudaMallocAsync: attention backward's
// deltas, the loss, reductions) from the device's default pool, which by default hands its memory
// back to the system at every synchronisation (each step has some), so the next step would map it
// again; kept instead, each step reuses the last one's.
void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  uint64_t keep_all = UINT64_MAX;
  check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
             "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)");
}

}  // namespace

void start_backend() {
  static std::once_flag once;
  static std::vector<std::unique_ptr<DeviceAllocator>> allocators;
  std::call_once(once, [] {
    const DeviceStatus& status = device_status();
    LOOM_CHECK(status.available, "the CUDA backend cannot start: " + status.reason);
    for (int i = 0; i < status.devices && i < kMaxCudaDevices; ++i) {
      keep_pool_memory(i);
      allocators.push_back(std::make_unique<DeviceAllocator>(i));
      register_allocator(Device::cuda(i), allocators.back().get());
    }
    CudaEntries& entries = kernels::cuda_entries();
    register_kernels(entries);
    entries.devices = static_cast<int>(allocators.size());
    entries.started = true;
  });
}

}  // namespace loom::kernels::cuda
