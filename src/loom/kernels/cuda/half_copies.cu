#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/half_copies.h"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace {

void check_half(DType dtype, const char* op) {
  LOOM_CHECK(dtype == DType::BF16 || dtype == DType::F16,
             std::string("kernels::") + op + ": 16-bit copies are bf16 or f16, not " + dtype_name(dtype));
}

template <typename Half>
__global__ void widen_kernel(float* __restrict__ dst, const Half* __restrict__ src, int64_t n, bool accumulate) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    float v;
    if constexpr (std::is_same_v<Half, __nv_bfloat16>) {
      v = __bfloat162float(src[i]);
    } else {
      v = __half2float(src[i]);
    }
    dst[i] = accumulate ? __fadd_rn(dst[i], v) : v;
  }
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
    widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, static_cast<const __nv_bfloat16*>(src), n, accumulate);
  } else {
    widen_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, static_cast<const __half*>(src), n, accumulate);
  }
  check_launch("widen_kernel");
}

}  // namespace loom::kernels::cuda
