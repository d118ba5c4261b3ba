#pragma once
// Four consecutive elements read or written as one aligned access (16 bytes of fp32, 8 of bf16 or
// fp16, 4 of FP8 codes), for the memory-bound element-wise kernels: HBM approaches its bandwidth
// only with enough bytes in flight (on an H200 about 4.3 TB/s times the latency of a load, a few
// MB), and a grid of threads each waiting on one 2- or 4-byte load at a time holds about one MB.
// The same arithmetic per element as the one-element loops, so the same bits.
#include <cstdint>
#include <type_traits>

#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// Whether `p` may be read or written as Pack4<T>: its address a multiple of the pack's size.
template <typename T>
inline bool pack4_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack4<T>) == 0;
}

// The pack starting at x (pack-aligned).
template <typename T>
__device__ inline Pack4<T> pack_at(const T* x) {
  return *reinterpret_cast<const Pack4<T>*>(x);
}

// The flat kernels' loop over the packs of a tensor of n elements: a block's step covers kPacks x
// blockDim.x consecutive packs, thread t's being t, t + blockDim.x, ... (each load a warp's 32
// consecutive packs); load(j, p) for each of a thread's packs of the step before compute(j, p) for
// any, so a thread keeps kPacks packs' loads in flight. Then element(i) for the last n % 4
// elements, grid-stride (launch.cuh).
template <int kPacks, typename Load, typename Compute, typename Element>
__device__ inline void grid_pack_steps(int64_t n, Load load, Compute compute, Element element) {
  const int64_t packs = n / 4, step = static_cast<int64_t>(gridDim.x) * blockDim.x * kPacks;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) * kPacks + threadIdx.x; p < packs; p += step) {
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (p + j * blockDim.x < packs) load(j, p + j * blockDim.x);
    }
#pragma unroll
    for (int j = 0; j < kPacks; ++j) {
      if (p + j * blockDim.x < packs) compute(j, p + j * blockDim.x);
    }
  }
  for (int64_t i = packs * 4 + grid_start(); i < n; i += grid_stride()) element(i);
}

// pack(p) for each whole pack p, then element(i) for the last n % 4 elements: grid_pack_steps one
// pack at a time (plain grid-stride loops).
template <typename Pack, typename Element>
__device__ inline void grid_packs(int64_t n, Pack pack, Element element) {
  grid_pack_steps<1>(
      n, [](int, int64_t) {}, [&](int, int64_t p) { pack(p); }, element);
}

// Elements [4 p, 4 p + 4) of x in fp32 (bf16 widened exactly: bf16_io.cuh's load).
template <typename T>
__device__ inline void load4(const T* x, int64_t p, float (&v)[4]) {
  const Pack4<T> a = pack_at(x + 4 * p);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = load(a.v, k);
}

// Stores v into elements [4 p, 4 p + 4) of x (bf16 rounded as bf16_io.cuh's store; a Discard
// output writes nothing) and returns the max |value| as stored (amax.cuh's nan_max).
template <typename T>
__device__ inline float store4(T* x, int64_t p, const float (&v)[4]) {
  Pack4<T> a;
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) m = nan_max(m, fabsf(store(a.v, k, v[k])));
  if constexpr (!std::is_same_v<T, Discard>) reinterpret_cast<Pack4<T>*>(x)[p] = a;
  return m;
}

}  // namespace loom::kernels::cuda
