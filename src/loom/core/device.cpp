#include "loom/core/device.h"

#include <array>
#include <cstdlib>
#include <cstring>

#include "loom/core/release_pages.h"

namespace loom {

std::string Device::name() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

void Allocator::count_allocation(size_t bytes) {
  const int64_t now = in_use_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed) +
                      static_cast<int64_t>(bytes);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void Allocator::reset_peak_bytes() {
  peak_.store(bytes_in_use(), std::memory_order_relaxed);
  // An allocation another thread counted between the two lines above is not lost.
  const int64_t now = bytes_in_use();
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void Allocator::count_free(size_t bytes) { in_use_.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed); }

namespace {

class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw OutOfMemory("host allocator: out of memory allocating " + std::to_string(bytes) + " bytes");
    count_allocation(bytes);
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    std::free(ptr);
    count_free(bytes);
  }
  void zero(void* ptr, size_t bytes) override {
    if (bytes > 0) std::memset(ptr, 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
  }
  // Pages given back to the system; a write fault brings them back (commit has nothing to do).
  void decommit(void* ptr, size_t bytes) override { release_pages(ptr, bytes); }
  void to_host(void* host_dst, const void* src, size_t bytes) override { copy(host_dst, src, bytes); }
  void from_host(void* dst, const void* host_src, size_t bytes) override { copy(dst, host_src, bytes); }
  size_t alignment() const override { return kAlignment; }
  Device device() const override { return Device::cpu(); }

 private:
  static constexpr size_t kAlignment = 64;
};

struct Registry {
  std::atomic<Allocator*> cpu{&host_allocator()};
  std::array<std::atomic<Allocator*>, kMaxCudaDevices> cuda{};
};

Registry& registry() {
  static Registry r;
  return r;
}

std::atomic<Allocator*>& slot(Device device) {
  LOOM_CHECK(device.is_cpu() || (device.index >= 0 && device.index < kMaxCudaDevices),
             "device " + device.name() + ": index out of range (at most " + std::to_string(kMaxCudaDevices) +
                 " GPUs)");
  return device.is_cpu() ? registry().cpu : registry().cuda[static_cast<size_t>(device.index)];
}

}  // namespace

void* Allocator::allocate_transfer_staging(size_t bytes) { return host_allocator().allocate(bytes); }
void Allocator::free_transfer_staging(void* ptr, size_t bytes) { host_allocator().free(ptr, bytes); }

namespace {
struct PassedFence final : DeviceFence {
  void wait() override {}
};
}  // namespace

std::unique_ptr<DeviceFence> Allocator::fence() { return std::make_unique<PassedFence>(); }

Allocator& host_allocator() {
  static HostAllocator host;
  return host;
}

Allocator& allocator(Device device) {
  Allocator* a = slot(device).load(std::memory_order_acquire);
  LOOM_CHECK(a != nullptr, "device " + device.name() + " has no allocator: " +
                               (device.is_cuda() ? "this build has no CUDA backend, or it was not started"
                                                 : "none registered"));
  return *a;
}

void register_allocator(Device device, Allocator* allocator) {
  slot(device).store(allocator, std::memory_order_release);
}

void synchronize_devices() {
  for (auto& device : registry().cuda) {
    if (Allocator* a = device.load(std::memory_order_acquire)) a->synchronize();
  }
}

}  // namespace loom
