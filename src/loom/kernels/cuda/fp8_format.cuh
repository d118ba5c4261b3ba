#pragma once
// The OCP FP8 formats E4M3 and E5M2 in device code: the same bit manipulation as
// precision/formats.h's NarrowFloat (round to nearest even, exact subnormals, sign of zero kept,
// NaN stays NaN, saturating or not past the largest finite value), so a device cast is the CPU's
// bit for bit. The subnormal path lets the fp32 adder round (x + magic), written __fadd_rn so no
// contraction can change it.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/quantize.h"

namespace loom::kernels::cuda {

template <int kMantissa, int kBias, uint32_t kMaxCode, uint32_t kInfCode, uint32_t kNanCode>
struct DeviceFp8 {
  static constexpr bool kHasInf = kInfCode != 0;
  static constexpr uint32_t kSignBit = 0x80u;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  static constexpr uint32_t kMagicBits = static_cast<uint32_t>(127 + 23 + 1 - kBias - kMantissa) << 23;
  static constexpr uint32_t kQuantumBits = static_cast<uint32_t>(127 + 1 - kBias - kMantissa) << 23;

  __device__ static uint32_t encode(float x, bool saturate) {
    const uint32_t u = __float_as_uint(x);
    const uint32_t sign = (u >> 31) ? kSignBit : 0u;
    const uint32_t a = u & 0x7fffffffu;
    constexpr int kShift = 23 - kMantissa;
    const uint32_t rounded = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
    const uint32_t normal_code = rounded - (static_cast<uint32_t>(127 - kBias) << kMantissa);
    const float magic = __uint_as_float(kMagicBits);
    const uint32_t subnormal_code = __float_as_uint(__fadd_rn(__uint_as_float(a), magic)) - kMagicBits;
    uint32_t code = a < kMinNormalBits ? subnormal_code : normal_code;
    const uint32_t overflow_code = saturate ? kMaxCode : (kHasInf ? kInfCode : kNanCode);
    if (a >= 0x7f800000u) {
      code = a > 0x7f800000u ? kNanCode : overflow_code;
    } else if (code > kMaxCode) {
      code = overflow_code;
    }
    return sign | code;
  }

  __device__ static float decode(uint32_t code) {
    const uint32_t sign = (code & kSignBit) ? 0x80000000u : 0u;
    const uint32_t mag = code & (kSignBit - 1u);
    uint32_t bits;
    if (mag > kMaxCode) {
      bits = (kHasInf && mag == kInfCode) ? 0x7f800000u : 0x7fc00000u;
    } else if (mag < (1u << kMantissa)) {
      bits = __float_as_uint(__fmul_rn(static_cast<float>(mag), __uint_as_float(kQuantumBits)));
    } else {
      bits = (mag << (23 - kMantissa)) + (static_cast<uint32_t>(127 - kBias) << 23);
    }
    return __uint_as_float(sign | bits);
  }
};

using DeviceE4M3 = DeviceFp8<3, 7, 0x7e, 0, 0x7f>;
using DeviceE5M2 = DeviceFp8<2, 15, 0x7b, 0x7c, 0x7e>;

__device__ inline uint8_t fp8_encode(float x, Fp8 format, bool saturate = true) {
  return static_cast<uint8_t>(format == Fp8::E4M3 ? DeviceE4M3::encode(x, saturate) : DeviceE5M2::encode(x, saturate));
}
__device__ inline float fp8_decode(uint8_t code, Fp8 format) {
  return format == Fp8::E4M3 ? DeviceE4M3::decode(code) : DeviceE5M2::decode(code);
}
// A per-tensor FP8 scale pair as the products read it (kernels/precision_gemm.h): the scale, and
// its inverse kFp8InverseOffset floats after it, 1 / scale rounded once.
__device__ inline void store_fp8_scale_pair(float* pair, float scale) {
  pair[0] = scale;
  pair[kFp8InverseOffset] = __fdiv_rn(1.0f, scale);
}

// decode(encode(x * scale)) / scale, each step rounded on its own.
__device__ inline float fp8_round_trip(float x, Fp8 format, float scale) {
  return __fdiv_rn(fp8_decode(fp8_encode(__fmul_rn(x, scale), format), format), scale);
}

// An FP8 GEMM operand's code: x * scale encoded (saturating), but an Inf or NaN x as NaN, so the
// product shows it where a saturated Inf would hide it (kernels/precision_gemm.h).
__device__ inline uint8_t fp8_gemm_code(float x, float scale, Fp8 format) {
  return fp8_encode(isfinite(x) ? __fmul_rn(x, scale) : __uint_as_float(0x7fc00000u), format);
}

}  // namespace loom::kernels::cuda
