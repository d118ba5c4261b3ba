#pragma once
// Four consecutive elements read or written as one aligned access (16 bytes of fp32, 8 of bf16 or
// fp16, 4 of FP8 codes), for the memory-bound element-wise kernels: HBM approaches its bandwidth
// only with enough bytes in flight (on an H200 about 4.3 TB/s times the latency of a load, a few
// MB), and a grid of threads each waiting on one 2- or 4-byte load at a time holds about one MB.
// The same arithmetic per element as the one-element loops, so the same bits.
#include <cstdint>

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

}  // namespace loom::kernels::cuda
