#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/half_copies.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"

namespace loom::kernels::cuda {

namespace {

void check_half(DType dtype, const char* op) {
  LOOM_CHECK(dtype == DType::BF16 || dtype == DType::F16,
             std::string("kernels::") + op + ": 16-bit copies are bf16 or f16, not " + dtype_name(dtype));
}

template <typename Half>
__device__ inline float widened(Half h) {
  if constexpr (std::is_same_v<Half, __nv_bfloat16>) {
    return __bfloat162float(h);
  } else {
    return __half2float(h);
  }
}

template <typename Half>
__global__ void widen_kernel(float* __restrict__ dst, const Half* __restrict__ src, int64_t n, bool accumulate) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float v = widened(src[i]);
    dst[i] = accumulate ? __fadd_rn(dst[i], v) : v;
  }
}

// widen_kernel four elements at a time (pack4.cuh; both pointers pack-aligned), then the last
// n % 4 one by one: the same sums.
template <typename Half>
__global__ void widen4_kernel(float* __restrict__ dst, const Half* __restrict__ src, int64_t n, bool accumulate) {
  auto* dst4 = reinterpret_cast<Pack4<float>*>(dst);
  grid_packs(
      n,
      [&](int64_t p) {
        const Pack4<Half> h = reinterpret_cast<const Pack4<Half>*>(src)[p];
        Pack4<float> d;
        if (accumulate) d = dst4[p];
#pragma unroll
        for (int k = 0; k < 4; ++k) d.v[k] = accumulate ? __fadd_rn(d.v[k], widened(h.v[k])) : widened(h.v[k]);
        dst4[p] = d;
      },
      [&](int64_t i) {
        const float v = widened(src[i]);
        dst[i] = accumulate ? __fadd_rn(dst[i], v) : v;
      });
}

template <typename Half>
void widen(float* dst, const Half* src, int64_t n, bool accumulate, cudaStream_t stream) {
  if (pack4_aligned<Half>(src) && pack4_aligned<float>(dst)) {
    widen4_kernel<<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(dst, src, n, accumulate);
    check_launch("widen4_kernel");
    return;
  }
  widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, src, n, accumulate);
  check_launch("widen_kernel");
}

}  // namespace

void narrow_floats(void* dst, const float* src, int64_t n, DType dtype, cudaStream_t stream) {
  check_half(dtype, "narrow_floats");
  cast_operand(src, dst, 1, n, false, dtype == DType::BF16 ? CastTo::BF16 : CastTo::F16, nullptr, stream);
}

void widen_floats(float* dst, const void* src, int64_t n, DType dtype, bool accumulate, cudaStream_t stream) {
  check_half(dtype, "widen_floats");
  if (n == 0) return;
  if (dtype == DType::BF16) {
    widen(dst, static_cast<const __nv_bfloat16*>(src), n, accumulate, stream);
  } else {
    widen(dst, static_cast<const __half*>(src), n, accumulate, stream);
  }
}

}  // namespace loom::kernels::cuda
