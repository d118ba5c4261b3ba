#pragma once
// Loads and stores of fp32 or bf16 elements (device code): kernels templated on their tensors'
// element type compute in fp32 either way, widening bf16 loads exactly and rounding bf16 stores to
// nearest even, so the bf16 form of a kernel stores round() of what its fp32 form stores.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace loom::kernels::cuda {

__device__ inline float load(const float* x, int64_t i) { return x[i]; }
__device__ inline float load(const __nv_bfloat16* x, int64_t i) { return __bfloat162float(x[i]); }
// A store returns the value as stored (rounded, for bf16): what a kernel taking the amax of its
// output maxes.
__device__ inline float store(float* x, int64_t i, float v) {
  x[i] = v;
  return v;
}
__device__ inline float store(__nv_bfloat16* x, int64_t i, float v) {
  const __nv_bfloat16 b = __float2bfloat16_rn(v);
  x[i] = b;
  return __bfloat162float(b);
}

// An output not kept: a kernel templated on its output type computes (and takes the amax of)
// what it would store and writes nothing (an FP8 operand's amax pass before its codes are cast
// from the same values: activation_codes.h).
struct Discard {};
__device__ inline float store(Discard*, int64_t, float v) { return v; }

// Whether a kernel storing through T needs its outputs at all: not when they are discarded and no
// amax of them was asked for (a norm's statistics pass under fp8_delayed, whose codes pass takes
// the amax), which saves a second read of the row and the weights.
template <typename T>
__device__ inline bool outputs_wanted(const unsigned* amax) {
  return !std::is_same_v<T, Discard> || amax != nullptr;
}

}  // namespace loom::kernels::cuda
