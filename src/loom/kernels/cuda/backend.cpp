#include "loom/kernels/cuda/backend.h"

#include <memory>
#include <mutex>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/entries.h"
#include "loom/kernels/cuda/releasable_memory.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::kernels::cuda {

namespace {

// One GPU's memory for the core layer's registry: the caching allocator, made thread-safe (ranks
// may be threads), with the device made current around every call; releasable memory (the
// model's flat buffers, which ZeRO 2 and 3 decommit range by range) through virtual memory
// management (releasable_memory.h), made when first asked for.
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int index) : index_(index) {}
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    void* p = cache_.allocate(bytes);
    count_allocation(bytes);
    return p;
  }
  void* allocate_releasable(size_t bytes) override {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    if (!releasable_) releasable_ = std::make_unique<ReleasableMemory>(index_);
    void* p = releasable_->allocate(bytes);
    count_allocation(bytes);
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    size_t decommitted = 0;
    if (releasable_ && releasable_->free(ptr, compute_stream(index_), decommitted)) {
      count_free(bytes - decommitted);
      return;
    }
    cache_.release(ptr);
    count_free(bytes);
  }
  void decommit(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(releasable_ != nullptr, "cuda:" + std::to_string(index_) + ": decommit of memory not allocated releasable");
    check_cuda(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
    count_free(releasable_->decommit(ptr, bytes, compute_stream(index_)));
  }
  void commit(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    LOOM_CHECK(releasable_ != nullptr, "cuda:" + std::to_string(index_) + ": commit of memory not allocated releasable");
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
  // returns once the host side may be read (to_host) or reused (from_host).
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    transfer(host_dst, src, bytes, cudaMemcpyDeviceToHost, "cudaMemcpyAsync (device to host)");
  }
  void from_host(void* dst, const void* host_src, size_t bytes) override {
    transfer(dst, host_src, bytes, cudaMemcpyHostToDevice, "cudaMemcpyAsync (host to device)");
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
  std::unique_ptr<ReleasableMemory> releasable_;
};

}  // namespace

cudaStream_t compute_stream(int /*index*/) { return nullptr; }

void start_backend() {
  static std::once_flag once;
  static std::vector<std::unique_ptr<DeviceAllocator>> allocators;
  std::call_once(once, [] {
    const DeviceStatus& status = device_status();
    LOOM_CHECK(status.available, "the CUDA backend cannot start: " + status.reason);
    for (int i = 0; i < status.devices && i < kMaxCudaDevices; ++i) {
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
