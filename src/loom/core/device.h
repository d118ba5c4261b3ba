#pragma once
// Where memory lives and kernels run: a `Device` (cpu, or cuda with an index), a per-device
// `Allocator` behind one registry, and `DeviceBuffer<T>`, an owning array that allocates through
// it. The host allocator is registered from the start; a CUDA build registers its caching
// allocator per GPU (kernels/cuda/backend.h). See docs/architecture.md, "The device seam".
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "loom/core/error.h"

namespace loom {

enum class DeviceKind : uint8_t { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;

  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int index) { return {DeviceKind::Cuda, index}; }
  constexpr bool is_cpu() const { return kind == DeviceKind::Cpu; }
  constexpr bool is_cuda() const { return kind == DeviceKind::Cuda; }
  friend constexpr bool operator==(Device, Device) = default;
  std::string name() const;  // "cpu", "cuda:0"
};

constexpr int kMaxCudaDevices = 16;

// A point in the work a thread's compute queue has issued on a device (Allocator::fence): wait()
// returns once everything issued before it is done (on a GPU: an event on the compute stream).
class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
  virtual void wait() = 0;
};

// Bytes on one device. allocate(0) returns nullptr; free(nullptr, 0) does nothing. zero and
// copy (within the device) are the two memory operations an owning buffer needs (growing keeps
// its contents); they run in the device's order of work (on a GPU: the compute stream of the
// calling thread's compute queue, core/compute_queue.h).
// to_host / from_host move bytes between this device and host memory: to_host returns once the
// bytes are on the host (after the device's earlier work), from_host once `src` may be reused.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void free(void* ptr, size_t bytes) = 0;
  virtual void zero(void* ptr, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // `rows` runs of `width` bytes within the device, from `src` every `src_pitch` bytes to `dst`
  // every `dst_pitch` bytes (one strided copy on a GPU; here a copy per row).
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) {
    for (size_t r = 0; r < rows; ++r) {
      copy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, width);
    }
  }
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual size_t alignment() const = 0;
  virtual Device device() const = 0;
  // Returns once the work the calling thread's compute queue has issued on this device is done
  // (the host and the emulated device run everything at once: nothing to wait for).
  virtual void synchronize() {}
  // Whether `ptr` points into this device's memory, anywhere within an allocation (what the
  // communication layer stages through the host for backends that move host bytes). The host
  // allocator says false: host memory needs no staging.
  virtual bool holds(const void* ptr) const {
    (void)ptr;
    return false;
  }

  // Memory whose parts can be given back and taken again (the model's flat parameter and
  // gradient buffers, which ZeRO 2 and 3 release range by range). allocate_releasable is
  // allocate() with every granule committed (backed by memory); free() frees it as any other.
  // decommit(ptr, bytes): the range reads as zero from now on; the whole granules inside it lose
  // their memory and must not be touched (not even by the device) until committed again, the
  // partial granules at its ends, shared with neighbouring data, are zeroed and stay.
  // commit(ptr, bytes): the range may be touched again; its decommitted granules come back
  // zeroed, the others keep their contents. Both run in the device's order of work. A GPU has
  // no demand paging, so code that releases a range commits it before writing it again; on the
  // host, decommit gives the pages back (release_pages.h) and a write fault brings them back, so
  // commit does nothing there; on a GPU the decommit does not wait for the device: a granule's
  // memory goes at the allocator's next call after the work queued before the decommit is done
  // (by synchronize() at the latest), and is counted as given back at once. Granules: the host's
  // and the emulated device's pages, a GPU's allocation granularity (2 MiB). Defaults (memory
  // that is not releasable): decommit zeroes, commit does nothing.
  virtual void* allocate_releasable(size_t bytes) { return allocate(bytes); }
  virtual void decommit(void* ptr, size_t bytes) { zero(ptr, bytes); }
  virtual void commit(void* ptr, size_t bytes) {
    (void)ptr;
    (void)bytes;
  }

  // Host memory this device's to_host and from_host move large, reused arrays through fastest (an
  // offloaded optimizer's staging, optim/host_offload.h): page-locked on a GPU, where a transfer
  // from pageable memory is staged by the driver at a fraction of the link's rate; ordinary host
  // memory elsewhere (the default). Not counted in bytes_in_use(): it is the host's.
  virtual void* allocate_transfer_staging(size_t bytes);
  virtual void free_transfer_staging(void* ptr, size_t bytes);
  // Transfers between this device and its transfer staging that return at once, queued in the
  // device's order of work (on a GPU: the compute stream, the copy engine running while the host
  // goes on): the host side must not be read (to_host_async) or written (from_host_async) until a
  // fence taken after them was waited for. The defaults wait, as to_host and from_host.
  virtual void to_host_async(void* host_dst, const void* src, size_t bytes) { to_host(host_dst, src, bytes); }
  virtual void from_host_async(void* dst, const void* host_src, size_t bytes) { from_host(dst, host_src, bytes); }
  // A fence after the work the calling thread's compute queue has issued on this device so far
  // (the default, for devices that run everything at once: nothing to wait for).
  virtual std::unique_ptr<DeviceFence> fence();

  // Bytes held now and at most so far: on a device, committed bytes (decommitted granules are
  // not counted); on the host, allocated bytes (the pages given back show in the resident set).
  int64_t bytes_in_use() const { return in_use_.load(std::memory_order_relaxed); }
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // The peak from now on (e.g. over one training step).
  void reset_peak_bytes();

 protected:
  // Implementations call these with the bytes asked for (thread-safe).
  void count_allocation(size_t bytes);
  void count_free(size_t bytes);

 private:
  std::atomic<int64_t> in_use_{0}, peak_{0};
};

// The allocator of `device`; throws loom::Error naming the device when none is registered (a
// cuda device in a build without the CUDA backend, or before it registered).
Allocator& allocator(Device device);
// Registers (or replaces, with nullptr removes) the allocator of `device`. The registry holds a
// pointer: the allocator must outlive its use. Registration happens at start-up, before any
// buffer on that device exists.
void register_allocator(Device device, Allocator* allocator);
// The host allocator (64-byte aligned, std::aligned_alloc), registered for Device::cpu().
Allocator& host_allocator();
// Allocator::synchronize on every registered device: what a thread calls before it ends so that
// the thread joining it finds everything its queue's work wrote (comm/threads' rank threads).
void synchronize_devices();

// Host <-> device transfers of n elements through `device`'s allocator (on the cpu: a copy).
template <typename T>
void copy_to_host(Device device, T* host_dst, const T* src, int64_t n) {
  if (n > 0) allocator(device).to_host(host_dst, src, static_cast<size_t>(n) * sizeof(T));
}
template <typename T>
void copy_from_host(Device device, T* dst, const T* host_src, int64_t n) {
  if (n > 0) allocator(device).from_host(dst, host_src, static_cast<size_t>(n) * sizeof(T));
}
// Copies n elements within one device (the ranges must not overlap).
template <typename T>
void copy_on_device(Device device, T* dst, const T* src, int64_t n) {
  if (n > 0) allocator(device).copy(dst, src, static_cast<size_t>(n) * sizeof(T));
}
// n elements set to zero bits on their device.
template <typename T>
void zero_on_device(Device device, T* dst, int64_t n) {
  if (n > 0) allocator(device).zero(dst, static_cast<size_t>(n) * sizeof(T));
}

// Copies `rows` rows of `width` elements within one device, row r from src + r * src_stride to
// dst + r * dst_stride (e.g. a column block of a wider matrix). On the CPU a plain loop.
template <typename T>
void copy_rows(Device device, T* dst, int64_t dst_stride, const T* src, int64_t src_stride, int64_t rows,
               int64_t width) {
  if (rows <= 0 || width <= 0) return;
  if (device.is_cpu()) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* from = src + r * src_stride;
      std::copy(from, from + width, dst + r * dst_stride);
    }
    return;
  }
  allocator(device).copy_2d(dst, static_cast<size_t>(dst_stride) * sizeof(T), src,
                            static_cast<size_t>(src_stride) * sizeof(T), static_cast<size_t>(width) * sizeof(T),
                            static_cast<size_t>(rows));
}

// An owning array of T on one device, allocated through that device's allocator. Elements are
// zero after allocation, as std::vector's; resize() keeps the first min(old, new) elements.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(Device device, int64_t n = 0) : device_(device) { resize(n); }
  // n elements in releasable memory (Allocator::allocate_releasable), which a later resize keeps.
  static DeviceBuffer releasable(Device device, int64_t n) {
    DeviceBuffer buffer(device);
    buffer.releasable_ = true;
    buffer.resize(n);
    return buffer;
  }
  // Copies are deep (on the same device), as std::vector's.
  DeviceBuffer(const DeviceBuffer& other) : device_(other.device_) {
    if (other.size_ == 0) return;
    Allocator& a = allocator(device_);
    data_ = static_cast<T*>(a.allocate(other.bytes()));
    a.copy(data_, other.data_, other.bytes());
    size_ = other.size_;
  }
  DeviceBuffer& operator=(const DeviceBuffer& other) {
    if (this != &other) DeviceBuffer(other).swap(*this);
    return *this;
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept { swap(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    DeviceBuffer(std::move(other)).swap(*this);
    return *this;
  }
  ~DeviceBuffer() { release(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Device device() const { return device_; }
  size_t bytes() const { return static_cast<size_t>(size_) * sizeof(T); }

  // Reallocates unless n == size(); new elements are zero.
  void resize(int64_t n) {
    if (n == size_) return;
    LOOM_CHECK(n >= 0, "DeviceBuffer: negative size " + std::to_string(n));
    Allocator& a = allocator(device_);
    const size_t bytes = static_cast<size_t>(n) * sizeof(T);
    T* fresh = static_cast<T*>(releasable_ ? a.allocate_releasable(bytes) : a.allocate(bytes));
    const size_t kept = static_cast<size_t>(n < size_ ? n : size_) * sizeof(T);
    if (kept > 0) a.copy(fresh, data_, kept);
    if (bytes > kept) a.zero(reinterpret_cast<char*>(fresh) + kept, bytes - kept);
    release();
    data_ = fresh;
    size_ = n;
  }
  void zero() {
    if (size_ > 0) allocator(device_).zero(data_, bytes());
  }
  // Frees the memory; the buffer stays on its device, empty.
  void release() {
    if (data_ != nullptr) allocator(device_).free(data_, bytes());
    data_ = nullptr;
    size_ = 0;
  }
  void swap(DeviceBuffer& other) noexcept {
    std::swap(device_, other.device_);
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(releasable_, other.releasable_);
  }

 private:
  Device device_;
  T* data_ = nullptr;
  int64_t size_ = 0;
  bool releasable_ = false;
};

}  // namespace loom
