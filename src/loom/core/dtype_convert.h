#pragma once
// The one implementation of bf16 / fp16 <-> f32 conversion in loom.
//
// To the narrow types: round to nearest, ties to even, subnormals exact, the sign of zero kept;
// past the largest finite value (bf16 3.3895e38, fp16 65504) the result is +-Inf, as IEEE
// rounding gives; Inf stays Inf and NaN stays a quiet NaN (its sign and top payload bits kept,
// as the F16C instructions and the compiler's _Float16 do). Widening is exact.
//
// Callers that want another overflow policy (FP8 training's saturation) apply it on top of these
// (precision/formats.h).
#include <bit>
#include <cstdint>

#include "loom/core/dtype.h"

namespace loom {

inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

inline uint16_t f32_to_bf16(float value) {
  const uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the
  // exponent is the correct rounding up (to Inf past the largest finite value).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {  // Inf or NaN (quieted, as the hardware conversion does)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t f32_to_f16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // 65520 and up round past 65504
  if (x < 0x38800000u) {
    // Below fp16's smallest normal: adding 0.5 (whose f32 ulp is 2^-24, the fp16 subnormal step)
    // lets the FPU round to nearest even; the low bits are then the fp16 subnormal mantissa, and a
    // round-up to 2^-14 lands exactly on the encoding of the smallest normal.
    const float rounded = std::bit_cast<float>(x) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(rounded) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  x += 0xc8000fffu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | (x >> 13));
}

// Array forms for f32, bf16 and f16 (f32: a copy; dst may equal src). Any other dtype throws
// loom::Error naming it. Narrow elements may be unaligned. The f16 paths use F16C where the
// build enables it (same results).
// dst[i] = f32(src[i]).
void to_f32(float* dst, const void* src, int64_t count, DType dtype);
// dst[i] = src[i] rounded to `dtype`.
void from_f32(void* dst, const float* src, int64_t count, DType dtype);

}  // namespace loom
