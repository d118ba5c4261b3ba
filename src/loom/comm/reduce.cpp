#include "loom/comm/reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "loom/core/error.h"

namespace loom::comm {

namespace {

// Elements per block: the f32 accumulator of a block (8 KiB) stays in L1 while every source
// streams through it.
constexpr int64_t kBlock = 2048;

// Max that propagates NaN from either side (a plain `x > a` would drop a NaN arriving second).
inline float max_nan(float a, float x) { return (x > a || x != x) ? x : a; }

void combine(float* acc, const float* x, int64_t count, ReduceOp op) {
  if (op == ReduceOp::Max) {
    for (int64_t i = 0; i < count; ++i) acc[i] = max_nan(acc[i], x[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) acc[i] += x[i];
  }
}

}  // namespace

bool reducible(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }

void check_reducible(DType dtype, const std::string& what) {
  LOOM_CHECK(reducible(dtype), what + ": dtype " + dtype_name(dtype) + " cannot be reduced (valid: f32, bf16, f16)");
}

float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_bf16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry into the
  // exponent is the correct rounding up (to infinity past the largest finite value).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {  // infinity or NaN (quieted, as the hardware conversion does)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // infinity or NaN
    return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (x < 0x38800000u) {
    // Below f16's smallest normal: adding 0.5 (whose f32 ulp is 2^-24, the f16 subnormal step)
    // lets the FPU round to nearest even; the low bits are then the f16 subnormal mantissa, and a
    // round-up to 2^-14 lands exactly on the encoding of the smallest normal.
    const float rounded = std::bit_cast<float>(x) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(rounded) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  x += 0xc8000fffu + ((x >> 13) & 1u);
  return static_cast<uint16_t>(sign | (x >> 13));
}

void to_f32(float* dst, const void* src, int64_t count, DType dtype) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::F32:
      if (dst != src) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= count; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
      }
#endif
      for (; i < count; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    default:
      check_reducible(dtype, "to_f32");
  }
}

void from_f32(void* dst, const float* src, int64_t count, DType dtype) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::F32:
      if (dst != src) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < count; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= count; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; i < count; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    default:
      check_reducible(dtype, "from_f32");
  }
}

void accumulate(float* acc, const void* src, int64_t count, DType dtype, ReduceOp op) {
  if (dtype == DType::F32) {
    combine(acc, static_cast<const float*>(src), count, op);
    return;
  }
  check_reducible(dtype, "accumulate");
  alignas(64) float block[kBlock];
  const auto* s = static_cast<const std::byte*>(src);
  const size_t element = dtype_size(dtype);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    to_f32(block, s + begin * element, n, dtype);
    combine(acc + begin, block, n, op);
  }
}

void finish(void* dst, const float* acc, int64_t count, DType dtype, ReduceOp op, int ranks) {
  if (op != ReduceOp::Avg) {
    from_f32(dst, acc, count, dtype);
    return;
  }
  LOOM_CHECK(ranks > 0, "finish: Avg over " + std::to_string(ranks) + " ranks");
  const float divisor = static_cast<float>(ranks);
  alignas(64) float block[kBlock];
  auto* d = static_cast<std::byte*>(dst);
  const size_t element = dtype_size(dtype);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    for (int64_t i = 0; i < n; ++i) block[i] = acc[begin + i] / divisor;
    from_f32(d + begin * element, block, n, dtype);
  }
}

void reduce_n(void* dst, const void* const* srcs, int n, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, "reduce");
  LOOM_CHECK(n >= 1, "reduce_n: needs at least one source (got " + std::to_string(n) + ")");
  const size_t element = dtype_size(dtype);
  alignas(64) float acc[kBlock];
  auto* d = static_cast<std::byte*>(dst);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const size_t offset = static_cast<size_t>(begin) * element;
    to_f32(acc, static_cast<const std::byte*>(srcs[0]) + offset, len, dtype);
    for (int q = 1; q < n; ++q) accumulate(acc, static_cast<const std::byte*>(srcs[q]) + offset, len, dtype, op);
    finish(d + offset, acc, len, dtype, op, n);
  }
}

void reduce_into(void* inout, const void* in, int64_t count, DType dtype, ReduceOp op) {
  check_reducible(dtype, "reduce_into");
  const size_t element = dtype_size(dtype);
  alignas(64) float acc[kBlock];
  auto* d = static_cast<std::byte*>(inout);
  const auto* s = static_cast<const std::byte*>(in);
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t len = std::min(kBlock, count - begin);
    const size_t offset = static_cast<size_t>(begin) * element;
    to_f32(acc, s + offset, len, dtype);
    accumulate(acc, d + offset, len, dtype, op == ReduceOp::Avg ? ReduceOp::Sum : op);
    from_f32(d + offset, acc, len, dtype);
  }
}

}  // namespace loom::comm
