#pragma once
// The narrow number formats of mixed-precision training and exact casts between them and fp32:
// bf16, fp16 (IEEE binary16), and the two OCP FP8 (OFP8) formats E4M3 and E5M2.
//
// Every cast from fp32 rounds to nearest, ties to even, handles subnormals exactly, and keeps the
// sign of zero; NaN in gives NaN out (with the input's sign). What happens past the largest finite
// value is the caller's choice (`Overflow`):
// - Saturate: clamp to +-max finite; infinities too. What FP8 training uses (TransformerEngine's
//   casts are "satfinite") and what OCP MX requires for its elements. Default for FP8.
// - NonSaturating: IEEE behaviour, overflow -> +-Inf. E4M3 has no Inf, so there it gives NaN.
//   Default for bf16 and fp16, so an overflow stays visible to the loss scaler.
//
// bf16 and fp16 are core's casts (core/dtype_convert.h) plus the overflow policy. The FP8 casts
// are inline bit manipulation (no tables, no loops over codes) because they run on every element
// of every emulated GEMM operand; the array forms live in formats.cpp.
//
// Format facts (OFP8 Rev 1.0; IEEE 754 for fp16; bf16 = the top half of fp32):
//   format  bias  max finite   min normal  min subnormal  Inf        NaN
//   E4M3      7   448          2^-6        2^-9           none       S.1111.111
//   E5M2     15   57344        2^-14       2^-16          S.11111.00 S.11111.{01,10,11}
//   fp16     15   65504        2^-14       2^-24          S.11111.0  S.11111.(!=0)
//   bf16    127   3.3895e38    2^-126      2^-133         as fp32    as fp32
#include <bit>
#include <cstdint>
#include <limits>
#include <string>

#include "loom/core/dtype_convert.h"

namespace loom::precision {

enum class Overflow : uint8_t { Saturate, NonSaturating };
enum class Fp8Format : uint8_t { E4M3, E5M2 };

std::string fp8_format_name(Fp8Format format);  // "e4m3" | "e5m2"

constexpr float max_finite(Fp8Format f) { return f == Fp8Format::E4M3 ? 448.0f : 57344.0f; }
constexpr float min_normal(Fp8Format f) { return f == Fp8Format::E4M3 ? 0x1p-6f : 0x1p-14f; }
constexpr float min_subnormal(Fp8Format f) { return f == Fp8Format::E4M3 ? 0x1p-9f : 0x1p-16f; }
constexpr int exponent_bias(Fp8Format f) { return f == Fp8Format::E4M3 ? 7 : 15; }
constexpr int mantissa_bits(Fp8Format f) { return f == Fp8Format::E4M3 ? 3 : 2; }
// Exponent of the largest normal value (OCP MX's emax_elem): 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15.
constexpr int max_normal_exponent(Fp8Format f) { return f == Fp8Format::E4M3 ? 8 : 15; }

namespace detail {

// A binary floating-point format narrower than fp32: kBits wide, kMantissa stored mantissa bits,
// exponent bias kBias. Codes below are magnitudes (sign bit clear). kInfCode == 0: no Inf.
template <int kBits, int kMantissa, int kBias, uint32_t kMaxCode, uint32_t kInfCode, uint32_t kNanCode>
struct NarrowFloat {
  static constexpr bool kHasInf = kInfCode != 0;
  static constexpr uint32_t kSignBit = 1u << (kBits - 1);
  // fp32 bits of the smallest normal value 2^(1-bias): below it the target is subnormal.
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  // 2^23 subnormal quanta (quantum 2^(1-bias-mantissa)): x + kMagic has exactly that quantum as
  // its ulp, so the fp32 adder itself rounds x to a subnormal code, ties to even.
  static constexpr float kMagic = std::bit_cast<float>(static_cast<uint32_t>(127 + 23 + 1 - kBias - kMantissa) << 23);
  static constexpr float kQuantum = std::bit_cast<float>(static_cast<uint32_t>(127 + 1 - kBias - kMantissa) << 23);

  static uint32_t encode(float x, Overflow overflow) {
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const uint32_t sign = (u >> 31) ? kSignBit : 0u;
    const uint32_t a = u & 0x7fffffffu;
    // Normal range: drop 23 - kMantissa mantissa bits rounding to nearest even on the integer
    // bits; a carry out of the mantissa correctly bumps the exponent. Then rebias.
    constexpr int kShift = 23 - kMantissa;
    const uint32_t rounded = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
    const uint32_t normal_code = rounded - (static_cast<uint32_t>(127 - kBias) << kMantissa);
    const uint32_t subnormal_code =
        std::bit_cast<uint32_t>(std::bit_cast<float>(a) + kMagic) - std::bit_cast<uint32_t>(kMagic);
    uint32_t code = a < kMinNormalBits ? subnormal_code : normal_code;
    const uint32_t overflow_code =
        overflow == Overflow::Saturate ? kMaxCode : (kHasInf ? kInfCode : kNanCode);
    if (a >= 0x7f800000u) {
      code = a > 0x7f800000u ? kNanCode : overflow_code;  // NaN stays NaN; Inf follows the policy
    } else if (code > kMaxCode) {
      code = overflow_code;
    }
    return sign | code;
  }

  static float decode(uint32_t code) {
    const uint32_t sign = (code & kSignBit) ? 0x80000000u : 0u;
    const uint32_t mag = code & (kSignBit - 1u);
    uint32_t bits;
    if (mag > kMaxCode) {
      bits = (kHasInf && mag == kInfCode) ? 0x7f800000u : 0x7fc00000u;
    } else if (mag < (1u << kMantissa)) {
      bits = std::bit_cast<uint32_t>(static_cast<float>(mag) * kQuantum);  // subnormal or zero, exact
    } else {
      bits = (mag << (23 - kMantissa)) + (static_cast<uint32_t>(127 - kBias) << 23);
    }
    return std::bit_cast<float>(sign | bits);
  }
};

using E4M3 = NarrowFloat<8, 3, 7, 0x7e, 0, 0x7f>;
using E5M2 = NarrowFloat<8, 2, 15, 0x7b, 0x7c, 0x7e>;

}  // namespace detail

// bf16 and fp16: core's conversions (core/dtype_convert.h: IEEE, overflow to +-Inf), with
// Saturate replacing an Inf result by +-max finite (bf16 0x7f7f, fp16 0x7bff).
inline uint16_t float_to_bf16(float x, Overflow overflow = Overflow::NonSaturating) {
  const uint16_t bits = f32_to_bf16(x);
  if (overflow == Overflow::Saturate && (bits & 0x7fffu) == 0x7f80u) return static_cast<uint16_t>((bits & 0x8000u) | 0x7f7fu);
  return bits;
}
inline float bf16_to_float(uint16_t bits) { return bf16_to_f32(bits); }

inline uint16_t float_to_fp16(float x, Overflow overflow = Overflow::NonSaturating) {
  const uint16_t bits = f32_to_f16(x);
  if (overflow == Overflow::Saturate && (bits & 0x7fffu) == 0x7c00u) return static_cast<uint16_t>((bits & 0x8000u) | 0x7bffu);
  return bits;
}
inline float fp16_to_float(uint16_t bits) { return f16_to_f32(bits); }

inline uint8_t float_to_e4m3(float x, Overflow overflow = Overflow::Saturate) {
  return static_cast<uint8_t>(detail::E4M3::encode(x, overflow));
}
inline float e4m3_to_float(uint8_t bits) { return detail::E4M3::decode(bits); }
inline uint8_t float_to_e5m2(float x, Overflow overflow = Overflow::Saturate) {
  return static_cast<uint8_t>(detail::E5M2::encode(x, overflow));
}
inline float e5m2_to_float(uint8_t bits) { return detail::E5M2::decode(bits); }

inline uint8_t float_to_fp8(float x, Fp8Format format, Overflow overflow = Overflow::Saturate) {
  return format == Fp8Format::E4M3 ? float_to_e4m3(x, overflow) : float_to_e5m2(x, overflow);
}
inline float fp8_to_float(uint8_t bits, Fp8Format format) {
  return format == Fp8Format::E4M3 ? e4m3_to_float(bits) : e5m2_to_float(bits);
}

namespace detail {
// quantize_dequantize_fp8 of one short span on the calling thread (blocks of a blockwise or MX
// recipe, each already inside a parallel loop); no argument checks.
template <class Format>
inline void quantize_dequantize_span(float* data, int64_t n, float scale, Overflow overflow) {
  for (int64_t i = 0; i < n; ++i) data[i] = Format::decode(Format::encode(data[i] * scale, overflow)) / scale;
}
inline void quantize_dequantize_span(float* data, int64_t n, Fp8Format format, float scale, Overflow overflow) {
  if (format == Fp8Format::E4M3) {
    quantize_dequantize_span<E4M3>(data, n, scale, overflow);
  } else {
    quantize_dequantize_span<E5M2>(data, n, scale, overflow);
  }
}
}  // namespace detail

// The nearest bf16 / fp16 value of each element, kept as fp32 (what a GEMM with bf16 / fp16
// operands sees). In place; OpenMP for large arrays.
void round_to_bf16(float* data, int64_t n, Overflow overflow = Overflow::NonSaturating);
void round_to_fp16(float* data, int64_t n, Overflow overflow = Overflow::NonSaturating);

// data[i] = decode(encode(data[i] * scale)) / scale: what an FP8 GEMM operand quantized with a
// per-tensor `scale` holds, back in fp32. The product x * scale is rounded to fp32 first, as the
// GPU kernels do. scale must be finite and > 0.
void quantize_dequantize_fp8(float* data, int64_t n, Fp8Format format, float scale,
                             Overflow overflow = Overflow::Saturate);

// Array casts: codes[i] = encode(in[i] * scale); out[i] = decode(codes[i]) * scale_inverse.
void encode_fp8(const float* in, uint8_t* codes, int64_t n, Fp8Format format, float scale,
                Overflow overflow = Overflow::Saturate);
void decode_fp8(const uint8_t* codes, float* out, int64_t n, Fp8Format format, float scale_inverse);

}  // namespace loom::precision
