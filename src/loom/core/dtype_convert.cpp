#include "loom/core/dtype_convert.h"

#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "loom/core/error.h"

namespace loom {

namespace {
// Narrow elements may sit at any byte offset (a safetensors payload does not promise alignment).
inline uint16_t load16(const unsigned char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(unsigned char* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }

[[noreturn]] void not_convertible(const char* what, DType dtype) {
  throw Error(std::string(what) + ": dtype " + dtype_name(dtype) + " is not a float type (valid: f32, bf16, f16)");
}
}  // namespace

void to_f32(float* dst, const void* src, int64_t count, DType dtype) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::F32:
      if (dst != src) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16: {
      const auto* s = static_cast<const unsigned char*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(load16(s + 2 * i));
      return;
    }
    case DType::F16: {
      const auto* s = static_cast<const unsigned char*>(src);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= count; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i))));
      }
#endif
      for (; i < count; ++i) dst[i] = f16_to_f32(load16(s + 2 * i));
      return;
    }
    default:
      not_convertible("to_f32", dtype);
  }
}

void from_f32(void* dst, const float* src, int64_t count, DType dtype) {
  if (count <= 0) return;
  switch (dtype) {
    case DType::F32:
      if (dst != src) std::memmove(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::BF16: {
      auto* d = static_cast<unsigned char*>(dst);
      for (int64_t i = 0; i < count; ++i) store16(d + 2 * i, f32_to_bf16(src[i]));
      return;
    }
    case DType::F16: {
      auto* d = static_cast<unsigned char*>(dst);
      int64_t i = 0;
#if defined(__F16C__)
      for (; i + 8 <= count; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
#endif
      for (; i < count; ++i) store16(d + 2 * i, f32_to_f16(src[i]));
      return;
    }
    default:
      not_convertible("from_f32", dtype);
  }
}

}  // namespace loom
