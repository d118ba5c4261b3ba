#include "loom/kernels/cuda/backend.h"

#include <memory>
#include <mutex>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/activation.h"
#include "loom/kernels/cuda/adamw.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/rmsnorm.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::kernels::cuda {

namespace {

// One GPU's memory for the core layer's registry: the caching allocator, made thread-safe (ranks
// may be threads), with the device made current around every call.
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
  void free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    cache_.release(ptr);
    count_free(bytes);
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
  size_t alignment() const override { return 256; }
  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  std::mutex mutex_;
  CachingAllocator cache_;
};

void rmsnorm_forward_entry(Device d, float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                           int64_t dim, float eps) {
  rmsnorm_forward(out, rstd, in, weight, rows, dim, eps, compute_stream(d.index));
}
void rmsnorm_backward_entry(Device d, float* din, float* dweight, const float* dout, const float* in,
                            const float* weight, const float* rstd, int64_t rows, int64_t dim) {
  rmsnorm_backward(din, dweight, dout, in, weight, rstd, rows, dim, compute_stream(d.index));
}
void adamw_update_entry(Device d, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                        const AdamWStep& step) {
  adamw_update(param, grad, exp_avg, exp_avg_sq, n, step, compute_stream(d.index));
}

void swiglu_forward_entry(Device d, float* out, const float* gate_up, int64_t rows, int64_t width) {
  swiglu_forward(out, gate_up, rows, width, compute_stream(d.index));
}
void swiglu_backward_entry(Device d, float* dgate_up, const float* dout, const float* gate_up, int64_t rows,
                           int64_t width) {
  swiglu_backward(dgate_up, dout, gate_up, rows, width, compute_stream(d.index));
}
void gelu_forward_entry(Device d, float* out, const float* in, int64_t n) {
  gelu_forward(out, in, n, compute_stream(d.index));
}
void gelu_backward_entry(Device d, float* din, const float* dout, const float* in, int64_t n) {
  gelu_backward(din, dout, in, n, compute_stream(d.index));
}

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
    entries.rmsnorm_forward = rmsnorm_forward_entry;
    entries.rmsnorm_backward = rmsnorm_backward_entry;
    entries.adamw_update = adamw_update_entry;
    entries.swiglu_forward = swiglu_forward_entry;
    entries.swiglu_backward = swiglu_backward_entry;
    entries.gelu_forward = gelu_forward_entry;
    entries.gelu_backward = gelu_backward_entry;
    entries.started = true;
  });
}

}  // namespace loom::kernels::cuda
