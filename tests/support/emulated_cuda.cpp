#include "emulated_cuda.h"
#include "emulated_precision.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/compute_queue.h"
#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/core/granules.h"
#include "loom/kernels/cuda_entries.h"
#include "loom/kernels/ops.h"
#ifdef LOOM_TEST_REAL_CUDA_ENTRIES
#include "loom/kernels/cuda/entries.h"
#endif

namespace loom::testing {

namespace {

std::string address(const void* p) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", p);
  return text;
}

// A device pointer's host address; a host pointer (untagged, non-null) is an Error naming `what`.
template <typename T>
T* device_to_host(T* p, const std::string& what) {
  if (p == nullptr) return p;
  LOOM_CHECK(is_emulated_device_pointer(p),
             "emulated cuda: " + what + " is host memory (" + address(p) + "), not the device's");
  return emulated_host_view(p);
}

// The census (emulated_cuda.h), shared by every emulated device and rank thread.
std::mutex g_census_mutex;
EmulatedCensus g_census;

// Transfers not waited for (Allocator::to_host_async / from_host_async), by compute queue, as
// host addresses, numbered in issue order: they run, in order, as late as a GPU's copy engine
// could: when their queue issues its next other operation or synchronises, or when a fence taken
// after them is waited for (the ones taken after that fence stay pending). So a host that reads
// (or rewrites) their host side before waiting for the right fence reads stale bytes (or has the
// new ones sent), and the bit-for-bit tests notice.
struct PendingCopy {
  uint64_t number;
  void* dst;
  const void* src;
  size_t bytes;
};
std::mutex g_pending_mutex;
std::map<int, std::deque<PendingCopy>> g_pending;
uint64_t g_next_pending = 0;

// The queue's pending transfers numbered below `before`, in order.
void run_pending(int queue, uint64_t before = std::numeric_limits<uint64_t>::max()) {
  std::vector<PendingCopy> copies;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    auto it = g_pending.find(queue);
    if (it == g_pending.end()) return;
    while (!it->second.empty() && it->second.front().number < before) {
      copies.push_back(it->second.front());
      it->second.pop_front();
    }
  }
  for (const PendingCopy& c : copies) std::memcpy(c.dst, c.src, c.bytes);
}

void defer_copy(void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending[compute_queue()].push_back({g_next_pending++, dst, src, bytes});
}

class EmulatedFence final : public DeviceFence {
 public:
  explicit EmulatedFence(int queue) : queue_(queue) {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    after_ = g_next_pending;
  }
  void wait() override;

 private:
  int queue_;
  uint64_t after_;  // the transfers numbered below it were issued before the fence
};

// Every operation first runs its queue's transfers issued before it (`in_order`), but for
// another transfer not waited for, which queues behind them.
template <typename Count>
void tally(Count count, bool in_order = true) {
  const int queue = compute_queue();
  if (in_order) run_pending(queue);
  std::lock_guard<std::mutex> lock(g_census_mutex);
  count(g_census);
  ++g_census.by_queue[queue];
}

void EmulatedFence::wait() {
  run_pending(queue_, after_);
  std::lock_guard<std::mutex> lock(g_census_mutex);
  ++g_census.fence_waits;
}

size_t host_page() {
  static const size_t page = [] {
    const long size = ::sysconf(_SC_PAGESIZE);
    return static_cast<size_t>(size > 0 ? size : 4096);
  }();
  return page;
}

void check_system(bool ok, const std::string& what) {
  LOOM_CHECK(ok, "emulated cuda: " + what + " failed: " + std::strerror(errno));
}

// Releasable memory: a page-aligned mapping of its own, its granules the host pages. A
// decommitted page is PROT_NONE (and its memory dropped), so any access to it, by a copy, a
// zero or a kernel, dies with SIGSEGV as it would (or worse) on a GPU.
class ReleasableRegions {
 public:
  // The host address of a new region of `bytes`.
  char* allocate(size_t bytes) {
    const size_t pages = (bytes + host_page() - 1) / host_page();
    void* p = ::mmap(nullptr, pages * host_page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    check_system(p != MAP_FAILED, "mmap of " + std::to_string(bytes) + " bytes");
    std::lock_guard<std::mutex> lock(mutex_);
    regions_[reinterpret_cast<uintptr_t>(p)] = Region{bytes, std::vector<char>(pages, 1), 0};
    return static_cast<char*>(p);
  }
  // Unmaps the region at `host` and says how many of its bytes were decommitted; false when
  // `host` is not a region's start.
  bool free(char* host, size_t& decommitted) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(host));
    if (it == regions_.end()) return false;
    decommitted = it->second.decommitted;
    check_system(::munmap(host, it->second.committed.size() * host_page()) == 0, "munmap");
    regions_.erase(it);
    return true;
  }
  // Bytes decommitted.
  size_t decommit(char* host, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [base, region] = find(host, bytes, "decommit");
    const size_t offset = static_cast<size_t>(host - base), page = host_page();
    for (const GranuleEdge& e : granule_edges(offset, bytes, page)) {
      if (region.committed[e.granule]) std::memset(base + e.offset, 0, e.bytes);
    }
    size_t released = 0;
    const GranuleRange whole = whole_granules(offset, bytes, page);
    for (size_t g = whole.first; g < whole.last; ++g) {
      if (!region.committed[g]) continue;
      char* at = base + g * page;
      check_system(::madvise(at, page, MADV_DONTNEED) == 0, "madvise(MADV_DONTNEED)");
      check_system(::mprotect(at, page, PROT_NONE) == 0, "mprotect(PROT_NONE)");
      region.committed[g] = 0;
      released += page;
    }
    region.decommitted += released;
    return released;
  }
  // Bytes committed again (zeroed).
  size_t commit(char* host, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [base, region] = find(host, bytes, "commit");
    const size_t page = host_page();
    size_t taken = 0;
    const GranuleRange touched = touched_granules(static_cast<size_t>(host - base), bytes, page);
    for (size_t g = touched.first; g < touched.last; ++g) {
      if (region.committed[g]) continue;
      char* at = base + g * page;
      check_system(::mprotect(at, page, PROT_READ | PROT_WRITE) == 0, "mprotect(PROT_READ | PROT_WRITE)");
      std::memset(at, 0, page);
      region.committed[g] = 1;
      taken += page;
    }
    region.decommitted -= taken;
    return taken;
  }
  bool committed(const char* host) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = regions_.upper_bound(reinterpret_cast<uintptr_t>(host));
    if (it == regions_.begin()) return true;
    --it;
    const size_t offset = reinterpret_cast<uintptr_t>(host) - it->first;
    if (offset >= it->second.committed.size() * host_page()) return true;  // not a region: ordinary memory
    return it->second.committed[offset / host_page()] != 0;
  }

 private:
  struct Region {
    size_t bytes = 0;
    std::vector<char> committed;  // per page
    size_t decommitted = 0;       // bytes
  };
  std::pair<char*, Region&> find(char* host, size_t bytes, const char* what) {
    auto it = regions_.upper_bound(reinterpret_cast<uintptr_t>(host));
    LOOM_CHECK(it != regions_.begin(), std::string("emulated cuda: ") + what + " of memory not allocated releasable");
    --it;
    char* base = reinterpret_cast<char*>(it->first);
    LOOM_CHECK(host + bytes <= base + it->second.bytes,
               std::string("emulated cuda: ") + what + " of " + std::to_string(bytes) + " bytes at " + address(host) +
                   " beyond its releasable allocation (or of memory not allocated releasable)");
    return {base, it->second};
  }

  std::mutex mutex_;
  std::map<uintptr_t, Region> regions_;  // by host start
};

class EmulatedAllocator final : public Allocator {
 public:
  explicit EmulatedAllocator(int index) : index_(index) {}
  void* allocate_releasable(size_t bytes) override {
    if (bytes == 0) return nullptr;
    char* p = releasable_.allocate(bytes);
    count_allocation(bytes);
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kDeviceTag);
  }
  void decommit(void* ptr, size_t bytes) override {
    if (bytes > 0) count_free(releasable_.decommit(device_to_host(static_cast<char*>(ptr), "decommit"), bytes));
  }
  void commit(void* ptr, size_t bytes) override {
    if (bytes > 0) count_allocation(releasable_.commit(device_to_host(static_cast<char*>(ptr), "commit"), bytes));
  }
  bool committed(const void* ptr) { return releasable_.committed(emulated_host_view(static_cast<const char*>(ptr))); }
  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + 255) / 256 * 256;
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr) throw OutOfMemory("emulated cuda: out of memory allocating " + std::to_string(bytes) + " bytes");
    count_allocation(bytes);
    return reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) | kDeviceTag);
  }
  void free(void* ptr, size_t bytes) override {
    if (ptr == nullptr) return;
    run_pending(compute_queue());  // a GPU's caching allocator reuses the memory in stream order
    char* host = device_to_host(static_cast<char*>(ptr), "free");
    size_t decommitted = 0;
    if (releasable_.free(host, decommitted)) {
      count_free(bytes - decommitted);
      return;
    }
    std::free(host);
    count_free(bytes);
  }
  void zero(void* ptr, size_t bytes) override {
    if (bytes == 0) return;
    tally([](EmulatedCensus& c) { ++c.zeroes; });
    std::memset(device_to_host(ptr, "zero"), 0, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    tally([](EmulatedCensus& c) { ++c.copies; });
    std::memcpy(device_to_host(dst, "copy's destination"), device_to_host(src, "copy's source"), bytes);
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows) override {
    if (width == 0 || rows == 0) return;
    tally([](EmulatedCensus& c) { ++c.copies; });
    char* d = device_to_host(static_cast<char*>(dst), "copy_2d's destination");
    const char* s = device_to_host(static_cast<const char*>(src), "copy_2d's source");
    for (size_t r = 0; r < rows; ++r) std::memcpy(d + r * dst_pitch, s + r * src_pitch, width);
  }
  // Plain host memory, as the default, remembered so that transfers through it are counted.
  void* allocate_transfer_staging(size_t bytes) override {
    void* p = Allocator::allocate_transfer_staging(bytes);
    std::lock_guard<std::mutex> lock(staging_mutex_);
    staging_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  void free_transfer_staging(void* ptr, size_t bytes) override {
    run_pending(compute_queue());  // cudaFreeHost waits for the device
    {
      std::lock_guard<std::mutex> lock(staging_mutex_);
      staging_.erase(reinterpret_cast<uintptr_t>(ptr));
    }
    Allocator::free_transfer_staging(ptr, bytes);
  }
  void to_host(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const bool staged = in_staging(host_dst, bytes);
    tally([bytes, staged](EmulatedCensus& c) {
      ++c.to_host;
      c.to_host_bytes += static_cast<int64_t>(bytes);
      if (staged) c.staged_transfer_bytes += static_cast<int64_t>(bytes);
    });
    LOOM_CHECK(!is_emulated_device_pointer(host_dst), "emulated cuda: to_host's destination is device memory");
    std::memcpy(host_dst, device_to_host(src, "to_host's source"), bytes);
  }
  void from_host(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    const bool staged = in_staging(host_src, bytes);
    tally([bytes, staged](EmulatedCensus& c) {
      ++c.from_host;
      c.from_host_bytes += static_cast<int64_t>(bytes);
      if (staged) c.staged_transfer_bytes += static_cast<int64_t>(bytes);
    });
    LOOM_CHECK(!is_emulated_device_pointer(host_src), "emulated cuda: from_host's source is device memory");
    std::memcpy(device_to_host(dst, "from_host's destination"), host_src, bytes);
  }
  void to_host_async(void* host_dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    const bool staged = in_staging(host_dst, bytes);
    tally(
        [bytes, staged](EmulatedCensus& c) {
          ++c.to_host_async;
          c.to_host_bytes += static_cast<int64_t>(bytes);
          if (staged) c.staged_transfer_bytes += static_cast<int64_t>(bytes);
        },
        false);
    LOOM_CHECK(staged, "emulated cuda: to_host_async's destination is not transfer staging");
    defer_copy(host_dst, device_to_host(src, "to_host_async's source"), bytes);
  }
  void from_host_async(void* dst, const void* host_src, size_t bytes) override {
    if (bytes == 0) return;
    const bool staged = in_staging(host_src, bytes);
    tally(
        [bytes, staged](EmulatedCensus& c) {
          ++c.from_host_async;
          c.from_host_bytes += static_cast<int64_t>(bytes);
          if (staged) c.staged_transfer_bytes += static_cast<int64_t>(bytes);
        },
        false);
    LOOM_CHECK(staged, "emulated cuda: from_host_async's source is not transfer staging");
    defer_copy(device_to_host(dst, "from_host_async's destination"), host_src, bytes);
  }
  std::unique_ptr<DeviceFence> fence() override { return std::make_unique<EmulatedFence>(compute_queue()); }
  void synchronize() override { run_pending(compute_queue()); }
  size_t alignment() const override { return 256; }
  Device device() const override { return Device::cuda(index_); }
  bool holds(const void* ptr) const override { return is_emulated_device_pointer(ptr); }

 private:
  // Whether [p, p + bytes) lies inside one transfer staging allocation.
  bool in_staging(const void* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(staging_mutex_);
    auto it = staging_.upper_bound(at);
    if (it == staging_.begin()) return false;
    --it;
    return at + bytes <= it->first + it->second;
  }

  int index_;
  ReleasableRegions releasable_;
  std::mutex staging_mutex_;
  std::map<uintptr_t, size_t> staging_;  // transfer staging by start: its bytes
};

int g_devices = 0;
std::vector<std::unique_ptr<EmulatedAllocator>> g_allocators;

// An op's name as a template argument, for the errors of its wrapper.
template <size_t N>
struct OpName {
  char text[N];
  constexpr OpName(const char (&s)[N]) { std::copy_n(s, N, text); }
};

std::string argument(const char* op, Device device, size_t index) {
  return "kernels::" + std::string(op) + " on " + device.name() + ": argument " + std::to_string(index + 1) +
         " (after the device)";
}

// How each argument of an entry reaches the CPU kernel: pointers are device memory, untagged;
// visibility's token arrays likewise; everything else (sizes, shapes, the host RoPE table) as is.
template <typename A>
struct Arg {
  static A map(A a, const char*, Device, size_t) { return a; }
};
template <typename T>
struct Arg<T*> {
  static T* map(T* p, const char* op, Device device, size_t index) {
    return device_to_host(p, argument(op, device, index));
  }
};
template <>
struct Arg<const kernels::AttentionVisibility&> {
  static kernels::AttentionVisibility map(const kernels::AttentionVisibility& v, const char* op, Device device,
                                         size_t index) {
    const std::string where = argument(op, device, index);
    return {device_to_host(v.q_pos, where + " q_pos"), device_to_host(v.k_pos, where + " k_pos"),
            device_to_host(v.q_doc, where + " q_doc"), device_to_host(v.k_doc, where + " k_doc")};
  }
};

template <>
struct Arg<const kernels::QkvRotation&> {
  static kernels::QkvRotation map(const kernels::QkvRotation& r, const char* op, Device device, size_t index) {
    return {r.table, r.seq, device_to_host(r.positions, argument(op, device, index) + " positions")};
  }
};

template <>
struct Arg<const kernels::RouterForward&> {
  static kernels::RouterForward map(const kernels::RouterForward& r, const char* op, Device device, size_t index) {
    const std::string where = argument(op, device, index);
    kernels::RouterForward h = r;
    h.logits = device_to_host(r.logits, where + " logits");
    h.bias = device_to_host(r.bias, where + " bias");
    h.expert = device_to_host(r.expert, where + " expert");
    h.weight = device_to_host(r.weight, where + " weight");
    h.lse = device_to_host(r.lse, where + " lse");
    h.prob_sums = device_to_host(r.prob_sums, where + " prob_sums");
    return h;
  }
};
template <>
struct Arg<const kernels::RouterBackward&> {
  static kernels::RouterBackward map(const kernels::RouterBackward& r, const char* op, Device device, size_t index) {
    const std::string where = argument(op, device, index);
    kernels::RouterBackward h = r;
    h.logits = device_to_host(r.logits, where + " logits");
    h.expert = device_to_host(r.expert, where + " expert");
    h.weight = device_to_host(r.weight, where + " weight");
    h.selection_row = device_to_host(r.selection_row, where + " selection_row");
    h.row_grad = device_to_host(r.row_grad, where + " row_grad");
    h.aux_f = device_to_host(r.aux_f, where + " aux_f");
    h.aux_factor = device_to_host(r.aux_factor, where + " aux_factor");
    return h;
  }
};

void check_device(Device device, const char* op) {
  LOOM_CHECK(device.is_cuda() && device.index >= 0 && device.index < g_devices,
             "emulated cuda: kernels::" + std::string(op) + " asked to run on " + device.name());
}

// The wrapper of the device-neutral entry Op: the same arguments, checked and untagged, to Op
// on the CPU (which runs the CPU kernel).
template <auto Op, OpName Name>
struct Emulate;
template <typename R, typename... A, R (*Op)(Device, A...), OpName Name>
struct Emulate<Op, Name> {
  static R call(Device device, A... a) {
    check_device(device, Name.text);
    tally([](EmulatedCensus& c) { ++c.entries[Name.text]; });
    return invoke(device, std::index_sequence_for<A...>{}, a...);
  }
  template <size_t... I>
  static R invoke(Device device, std::index_sequence<I...>, A... a) {
    return Op(Device::cpu(), Arg<A>::map(a, Name.text, device, I)...);
  }
};

// The multi-tensor AdamW takes a host array of device pointers (a kernel argument on a GPU). An
// FP8 weight's amax is the CPU's; its codes are kept as the casts' are (emulated_precision.h).
void adamw_update_many(Device device, const kernels::AdamWTensor* tensors, int64_t count,
                       const kernels::AdamWStep* steps, int64_t step_count) {
  check_device(device, "adamw_update_many");
  tally([](EmulatedCensus& c) { ++c.entries["adamw_update_many"]; });
  std::vector<kernels::AdamWTensor> host(tensors, tensors + count);
  for (size_t i = 0; i < host.size(); ++i) {
    const std::string where = "kernels::adamw_update_many's tensor " + std::to_string(i);
    kernels::AdamWTensor& t = host[i];  // checked by kernels::adamw_update_many
    kernels::AdamWFp8Weight fp8;
    if (t.fp8.amax != nullptr) fp8.amax = device_to_host(t.fp8.amax, where + " fp8.amax");
    t = {device_to_host(t.param, where + " param"),
         device_to_host(t.grad, where + " grad"),
         device_to_host(t.exp_avg, where + " exp_avg"),
         device_to_host(t.exp_avg_sq, where + " exp_avg_sq"),
         t.n,
         t.param_bf16 != nullptr ? device_to_host(t.param_bf16, where + " param_bf16") : nullptr,
         fp8,
         t.step_index};
  }
  kernels::adamw_update_many(Device::cpu(), host, std::span<const kernels::AdamWStep>(steps, step_count));
  for (int64_t i = 0; i < count; ++i) {
    if (tensors[i].fp8.forward != nullptr) emulated_keep_optimizer_codes(tensors[i].fp8, host[i].param);
  }
}

// zero_runs takes its runs as a host array (a kernel argument on a GPU).
void zero_runs(Device device, float* base, const kernels::FloatRun* runs, int64_t count) {
  check_device(device, "zero_runs");
  tally([](EmulatedCensus& c) { ++c.entries["zero_runs"]; });
  kernels::zero_runs(Device::cpu(), device_to_host(base, "zero_runs' base"),
                     std::span<const kernels::FloatRun>(runs, static_cast<size_t>(count)));
}

#define LOOM_EMULATED_OPS(X)                                                                                    \
  X(embedding_forward) X(embedding_backward) X(embedding_forward_shard) X(embedding_backward_shard)            \
  X(rmsnorm_forward) X(rmsnorm_backward) X(layernorm_forward) X(layernorm_backward) X(rope_forward)            \
  X(rmsnorm_forward_bf16) X(layernorm_forward_bf16) X(rmsnorm_backward_bf16) X(layernorm_backward_bf16)     \
  X(rmsnorm_add_forward_bf16) X(layernorm_add_forward_bf16)                                                    \
  X(rope_backward) X(swiglu_forward) X(swiglu_backward) X(gelu_forward) X(gelu_backward) X(relu2_forward)     \
  X(relu2_backward) X(activation_forward_bf16) X(activation_backward_bf16) X(add_rows) X(gather_rows) X(scatter_add_rows) X(row_dots)                                    \
  X(sigmoid_gate) X(sigmoid_gate_backward) X(moe_router_forward) X(moe_router_backward) X(linear_forward)                                                                    \
  X(linear_backward) X(add_bias) X(gemm_nt) X(gemm)                                                           \
  X(flash_attention_forward) X(flash_attention_backward) X(flash_attention_forward_bf16_tensors)               \
  X(flash_attention_backward_bf16_tensors) X(flash_attention_backward_bf16_gradients) X(rope_forward_bf16)    \
  X(flash_attention_backward_fp32_gradients)                                                                  \
  X(paged_attention) X(paged_prompt_attention) X(paged_cache_write) X(attention_decode)                        \
  X(merge_attention_partials) X(softmax_cross_entropy) X(softmax_cross_entropy_bf16) X(vocab_shard_row_max) X(vocab_shard_exp_sums)         \
  X(vocab_shard_gradient) X(vocab_shard_finish) X(adamw_update) X(sum_of_squares) X(scale_in_place)            \
  X(add_in_place) X(nesterov_outer_update)                                                                    \
  X(amax_into) X(amax_into_bf16) X(narrow_floats) X(widen_floats) X(ssd_scan_forward)      \
  X(ssd_scan_backward) X(ssd_scan_step)                                                                       \
  X(causal_conv_silu_forward) X(causal_conv_silu_backward) X(causal_conv_silu_step) X(gated_rmsnorm_forward)      \
  X(gated_rmsnorm_backward)

void fill_entries(kernels::CudaEntries& e) {
#define LOOM_EMULATE(op) e.op = &Emulate<&kernels::op, OpName(#op)>::call;
  LOOM_EMULATED_OPS(LOOM_EMULATE)
#undef LOOM_EMULATE
  e.adamw_update_many = &adamw_update_many;
  e.zero_runs = &zero_runs;
  e.profiler_capture = [](Device device, bool start) {
    check_device(device, "profiler_capture");
    tally([start](EmulatedCensus& c) { ++c.entries[start ? "profiler_capture: start" : "profiler_capture: stop"]; });
  };
  // The precision recipes' device-only entries: the CPU's emulation of them (emulated_precision.h).
  e.amax = [](Device device, const float* x, int64_t n) {
    tally([](EmulatedCensus& c) { ++c.entries["amax"]; });
    return emulated_amax(device, x, n);
  };
  e.round_in_place = [](Device device, float* x, int64_t n, kernels::OutputRounding rounding) {
    tally([](EmulatedCensus& c) { ++c.entries["round_in_place"]; });
    emulated_round_in_place(device, x, n, rounding);
  };
  e.precision_linear_gemm = [](Device device, const kernels::PrecisionGemm& gemm) {
    tally([](EmulatedCensus& c) { ++c.entries["precision_linear_gemm"]; });
    // A dgrad that casts its fp32 output gradient to bf16 itself (a pass over it on a GPU).
    const bool casts_dout = gemm.pass == kernels::LinearGemm::DataGrad && gemm.a.cast == kernels::OperandCast::Bf16 &&
                            gemm.a16 == nullptr && gemm.a_store_use != kernels::CastStore::Read;
    if (casts_dout) tally([](EmulatedCensus& c) { ++c.entries["precision_linear_gemm: dgrad casting dout to bf16"]; });
    // A wgrad writing its gradient whole (a stale one: model::ParameterStore::take_written_whole).
    if (gemm.pass == kernels::LinearGemm::WeightGrad && !gemm.accumulate)
      tally([](EmulatedCensus& c) { ++c.entries["precision_linear_gemm: wgrad written whole"]; });
    if (gemm.pre_gelu16 != nullptr || gemm.gelu_input16 != nullptr)
      tally([](EmulatedCensus& c) { ++c.entries["precision_linear_gemm: GELU epilogue"]; });
    emulated_precision_linear_gemm(device, gemm);
  };
  // Independent GEMMs in one call: each as precision_linear_gemm computes it, in order (what a
  // GPU groups runs in another order within bf16's rounding; here every GEMM is exact to its own).
  e.precision_linear_gemms = [](Device device, const kernels::PrecisionGemm* gemms, int64_t count) {
    tally([](EmulatedCensus& c) { ++c.entries["precision_linear_gemms"]; });
    for (int64_t i = 0; i < count; ++i) {
      const bool grouped = kernels::groupable(gemms[i]);
      tally([grouped](EmulatedCensus& c) {
        ++c.entries[grouped ? "precision_linear_gemms: groupable" : "precision_linear_gemms: alone"];
      });
      emulated_precision_linear_gemm(device, gemms[i]);
    }
  };
  e.activation_forward_codes = [](Device device, kernels::MlpActivation a, const void* in16, int64_t rows,
                                  int64_t width, const kernels::CastOperand& cast, void* codes, void* transposed) {
    tally([](EmulatedCensus& c) { ++c.entries["activation_forward_codes"]; });
    emulated_activation_forward_codes(device, a, in16, rows, width, cast, codes, transposed);
  };
  e.activation_backward_codes = [](Device device, kernels::MlpActivation a, const void* dout16, const void* in16,
                                   int64_t rows, int64_t width, const kernels::CastOperand& cast, void* codes,
                                   void* transposed) {
    tally([](EmulatedCensus& c) { ++c.entries["activation_backward_codes"]; });
    emulated_activation_backward_codes(device, a, dout16, in16, rows, width, cast, codes, transposed);
  };
  e.norm_statistics = [](Device device, float* mean, float* rstd, const float* in, const float* weight,
                          const float* bias, int64_t rows, int64_t dim, float eps, float* amax) {
    tally([](EmulatedCensus& c) { ++c.entries["norm_statistics"]; });
    emulated_norm_statistics(device, mean, rstd, in, weight, bias, rows, dim, eps, amax);
  };
  e.norm_forward_codes = [](Device device, const float* in, const float* weight, const float* bias,
                             const float* mean, const float* rstd, int64_t rows, int64_t dim,
                             const kernels::CastOperand& cast, void* codes, void* transposed) {
    tally([](EmulatedCensus& c) { ++c.entries["norm_forward_codes"]; });
    emulated_norm_forward_codes(device, in, weight, bias, mean, rstd, rows, dim, cast, codes, transposed);
  };
#ifdef LOOM_TEST_REAL_CUDA_ENTRIES
  // Only what the real backend serves: an op it lacks must fail here as it would on a GPU.
  kernels::CudaEntries real;
  kernels::cuda::register_kernels(real);
#define LOOM_KEEP_REAL(op) \
  if (real.op == nullptr) e.op = nullptr;
  LOOM_EMULATED_OPS(LOOM_KEEP_REAL)
  if (real.adamw_update_many == nullptr) e.adamw_update_many = nullptr;
  if (real.zero_runs == nullptr) e.zero_runs = nullptr;
  if (real.profiler_capture == nullptr) e.profiler_capture = nullptr;
  if (real.amax == nullptr) e.amax = nullptr;
  if (real.round_in_place == nullptr) e.round_in_place = nullptr;
  if (real.precision_linear_gemm == nullptr) e.precision_linear_gemm = nullptr;
  if (real.activation_forward_codes == nullptr) e.activation_forward_codes = nullptr;
  if (real.activation_backward_codes == nullptr) e.activation_backward_codes = nullptr;
  if (real.norm_statistics == nullptr) e.norm_statistics = nullptr;
  if (real.norm_forward_codes == nullptr) e.norm_forward_codes = nullptr;
#undef LOOM_KEEP_REAL
#endif
}

}  // namespace

void install_emulated_cuda(int devices) {
  static std::once_flag once;
  std::call_once(once, [devices] {
    LOOM_CHECK(devices >= 1 && devices <= kMaxCudaDevices, "emulated cuda: " + std::to_string(devices) + " devices");
    for (int i = 0; i < devices; ++i) {
      g_allocators.push_back(std::make_unique<EmulatedAllocator>(i));
      register_allocator(Device::cuda(i), g_allocators.back().get());
    }
    g_devices = devices;
    kernels::CudaEntries& entries = kernels::cuda_entries();
    fill_entries(entries);
    entries.devices = devices;
    entries.started = true;
  });
}

int64_t EmulatedCensus::launches() const {
  int64_t n = copies + zeroes;
  for (const auto& [op, calls] : entries) n += calls;
  return n;
}

void reset_emulated_census() {
  std::lock_guard<std::mutex> lock(g_census_mutex);
  g_census = EmulatedCensus{};
}

EmulatedCensus emulated_census() {
  std::lock_guard<std::mutex> lock(g_census_mutex);
  return g_census;
}

bool emulated_committed(Device device, const void* ptr) {
  LOOM_CHECK(device.is_cuda() && device.index < static_cast<int>(g_allocators.size()),
             "emulated cuda: no emulated " + device.name());
  return g_allocators[static_cast<size_t>(device.index)]->committed(ptr);
}

}  // namespace loom::testing
