#pragma once
// Helpers of the GPU tests: the skip when no GPU is usable (with the runtime's reason), the tests'
// fixture, fresh random inputs, bf16 roundings, device copies of host vectors, and the error
// measures the tests compare by.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda::testing {

#define SKIP_WITHOUT_GPU()                                                                             \
  do {                                                                                                 \
    if (!::loom::kernels::cuda::device_status().available)                                             \
      GTEST_SKIP() << ::loom::kernels::cuda::device_status().reason;                                   \
  } while (false)

inline std::vector<float> random_values(uint32_t seed, int64_t n, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) x = dist(rng);
  return out;
}

inline std::vector<int32_t> random_ids(uint32_t seed, int64_t n, int32_t lo, int32_t hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(lo, hi);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t& x : out) x = dist(rng);
  return out;
}

// A fresh seed per run, so every run checks new inputs; printed by the tests that use it.
inline uint32_t fresh_seed() { return std::random_device{}(); }

// The GPU tests' fixture: skipped, saying why, without a usable GPU; otherwise the backend started,
// a fresh seed (recorded with the test's result) and a caching allocator for device arrays.
template <typename Base = ::testing::Test>
class GpuTest : public Base {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    start_backend();
    seed_ = fresh_seed();
    ::testing::Test::RecordProperty("seed", static_cast<int>(seed_ % 1000000));
  }
  uint32_t seed_ = 0;
  CachingAllocator allocator_;
};

// A device copy of `host` from `allocator`, and back. The tests' own launches go on the legacy
// default stream (nullptr), which every compute stream waits for and is waited for by.
template <typename T>
struct DeviceArray {
  CachingAllocator& allocator;
  T* ptr;
  int64_t n;
  DeviceArray(CachingAllocator& a, const std::vector<T>& host)
      : allocator(a), ptr(static_cast<T*>(a.allocate(std::max<size_t>(1, host.size()) * sizeof(T), nullptr))),
        n(static_cast<int64_t>(host.size())) {
    if (!host.empty())
      check_cuda(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "copy to device");
  }
  ~DeviceArray() { allocator.release(ptr, nullptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> host() const {
    std::vector<T> out(static_cast<size_t>(n));
    check_cuda(cudaDeviceSynchronize(), "synchronize before the copy back");
    if (n > 0) check_cuda(cudaMemcpy(out.data(), ptr, out.size() * sizeof(T), cudaMemcpyDeviceToHost), "copy to host");
    return out;
  }
};
using DeviceFloats = DeviceArray<float>;

// ||got - want|| / ||want|| over want's elements (infinite when got has a non-finite element
// where want is finite, or fewer elements).
template <typename A, typename B>
double relative_error(const std::vector<A>& got, const std::vector<B>& want) {
  if (got.size() < want.size()) return INFINITY;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (!std::isfinite(g) && std::isfinite(w)) return INFINITY;
    if (!std::isfinite(w)) continue;
    diff += (g - w) * (g - w);
    norm += w * w;
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

// bf16 values: x rounded (to nearest even), converted and widened back.
inline std::vector<float> bf16_rounded(std::vector<float> x) {
  for (float& v : x) v = __bfloat162float(__float2bfloat16(v));
  return x;
}
inline std::vector<__nv_bfloat16> to_bf16(const std::vector<float>& x) {
  std::vector<__nv_bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(x[i]);
  return out;
}
inline std::vector<float> to_float(const std::vector<__nv_bfloat16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
  return out;
}

inline std::vector<float> poison(int64_t n) { return std::vector<float>(static_cast<size_t>(n), NAN); }

}  // namespace loom::kernels::cuda::testing
