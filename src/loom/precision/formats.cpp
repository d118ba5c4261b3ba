#include "loom/precision/formats.h"

#include "loom/core/error.h"
#include "loom/kernels/parallel.h"

namespace loom::precision {

std::string fp8_format_name(Fp8Format format) { return format == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

namespace {

// One loop per format so the cast inlines and the loop body has no per-element dispatch.
template <class Format>
void quantize_dequantize(float* data, int64_t n, float scale, Overflow overflow) {
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) data[i] = Format::decode(Format::encode(data[i] * scale, overflow)) / scale;
}

template <class Format>
void encode_scaled(const float* in, uint8_t* codes, int64_t n, float scale, Overflow overflow) {
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(Format::encode(in[i] * scale, overflow));
}

template <class Format>
void decode_scaled(const uint8_t* codes, float* out, int64_t n, float scale_inverse) {
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) out[i] = Format::decode(codes[i]) * scale_inverse;
}

void check_scale(float scale, const char* what) {
  LOOM_CHECK(scale > 0.0f && scale <= std::numeric_limits<float>::max(),
        std::string(what) + ": the scale must be finite and > 0, got " + std::to_string(scale));
}

}  // namespace

void round_to_bf16(float* data, int64_t n, Overflow overflow) {
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) data[i] = bf16_to_float(float_to_bf16(data[i], overflow));
}

void round_to_fp16(float* data, int64_t n, Overflow overflow) {
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) data[i] = fp16_to_float(float_to_fp16(data[i], overflow));
}

void quantize_dequantize_fp8(float* data, int64_t n, Fp8Format format, float scale, Overflow overflow) {
  check_scale(scale, "quantize_dequantize_fp8");
  if (format == Fp8Format::E4M3) {
    quantize_dequantize<detail::E4M3>(data, n, scale, overflow);
  } else {
    quantize_dequantize<detail::E5M2>(data, n, scale, overflow);
  }
}

void encode_fp8(const float* in, uint8_t* codes, int64_t n, Fp8Format format, float scale, Overflow overflow) {
  check_scale(scale, "encode_fp8");
  if (format == Fp8Format::E4M3) {
    encode_scaled<detail::E4M3>(in, codes, n, scale, overflow);
  } else {
    encode_scaled<detail::E5M2>(in, codes, n, scale, overflow);
  }
}

void decode_fp8(const uint8_t* codes, float* out, int64_t n, Fp8Format format, float scale_inverse) {
  if (format == Fp8Format::E4M3) {
    decode_scaled<detail::E4M3>(codes, out, n, scale_inverse);
  } else {
    decode_scaled<detail::E5M2>(codes, out, n, scale_inverse);
  }
}

}  // namespace loom::precision
