#include "loom/precision/mx.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "loom/core/error.h"
#include "loom/kernels/parallel.h"

namespace loom::precision {

namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// floor(log2(amax)) - emax_elem, clamped below to E8M0's -127. For a normal amax the biased fp32
// exponent field is floor(log2) + 127 exactly; a zero or subnormal amax (field 0) is below 2^-126,
// where the clamp gives -127 whatever its exact logarithm. amax must be finite.
int shared_exponent(float block_amax, Fp8Format format) {
  const int field = static_cast<int>((std::bit_cast<uint32_t>(block_amax) >> 23) & 0xffu);
  return std::max(-kE8M0Bias, field - 127 - max_normal_exponent(format));
}

// 2^-shared_exp as an fp32 normal number (shared_exp is in [-127, 119]); multiplying by it is V / X.
float inverse_scale(int shared_exp) { return std::bit_cast<float>(static_cast<uint32_t>(127 - shared_exp) << 23); }

// NaN-propagating max |v|.
float block_amax(const float* v, int64_t n, int64_t stride = 1) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i * stride]);
    m = (a > m || a != a) ? a : m;
  }
  return m;
}

void quantize_dequantize_run(float* v, int64_t n, Fp8Format format) {
  const float m = block_amax(v, n);
  if (!std::isfinite(m)) {
    std::fill(v, v + n, kNan);
    return;
  }
  // decode(encode(v / X)) * X, all exact but the element cast.
  detail::quantize_dequantize_span(v, n, format, inverse_scale(shared_exponent(m, format)), Overflow::Saturate);
}

uint8_t nan_code(Fp8Format format) { return format == Fp8Format::E4M3 ? 0x7f : 0x7e; }

}  // namespace

float e8m0_to_float(uint8_t bits) {
  if (bits == kE8M0Nan) return kNan;
  if (bits == 0) return 0x1p-127f;
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 23);
}

uint8_t mx_scale_bits(float amax_value, Fp8Format format) {
  if (!std::isfinite(amax_value)) return kE8M0Nan;
  return static_cast<uint8_t>(shared_exponent(std::fabs(amax_value), format) + kE8M0Bias);
}

MxBlock encode_mx_block(const float* v, int count, Fp8Format format) {
  LOOM_CHECK(count >= 1 && count <= kMxBlockSize,
        "encode_mx_block: a block holds 1 to " + std::to_string(kMxBlockSize) + " elements, got " +
            std::to_string(count));
  MxBlock block;
  block.count = count;
  block.scale_bits = mx_scale_bits(block_amax(v, count), format);
  if (block.scale_bits == kE8M0Nan) {
    std::fill(block.elements.begin(), block.elements.begin() + count, nan_code(format));
    return block;
  }
  const float inverse = inverse_scale(block.scale_bits - kE8M0Bias);
  for (int i = 0; i < count; ++i) block.elements[static_cast<size_t>(i)] = float_to_fp8(v[i] * inverse, format, Overflow::Saturate);
  return block;
}

void decode_mx_block(const MxBlock& block, Fp8Format format, float* out) {
  const float scale = e8m0_to_float(block.scale_bits);
  for (int i = 0; i < block.count; ++i) out[i] = fp8_to_float(block.elements[static_cast<size_t>(i)], format) * scale;
}

void encode_mx(const float* data, int64_t rows, int64_t cols, Fp8Format format, uint8_t* codes, uint8_t* scales) {
  const int64_t blocks = (cols + kMxBlockSize - 1) / kMxBlockSize;
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t begin = r * cols + b * kMxBlockSize;
      const int count = static_cast<int>(std::min<int64_t>(kMxBlockSize, cols - b * kMxBlockSize));
      const MxBlock block = encode_mx_block(data + begin, count, format);
      std::copy(block.elements.begin(), block.elements.begin() + count, codes + begin);
      scales[r * blocks + b] = block.scale_bits;
    }
  }
}

void decode_mx(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Fp8Format format,
               float* out) {
  const int64_t blocks = (cols + kMxBlockSize - 1) / kMxBlockSize;
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = fp8_to_float(codes[r * cols + c], format) * e8m0_to_float(scales[r * blocks + c / kMxBlockSize]);
    }
  }
}

void quantize_dequantize_mx(float* data, int64_t rows, int64_t cols, Fp8Format format) {
  const int64_t blocks = (cols + kMxBlockSize - 1) / kMxBlockSize;
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      quantize_dequantize_run(data + r * cols + b * kMxBlockSize, std::min<int64_t>(kMxBlockSize, cols - b * kMxBlockSize),
                              format);
    }
  }
}

namespace {

template <class Format>
void quantize_dequantize_columns(float* data, int64_t rows, int64_t cols, Fp8Format format) {
  // Work items: (32-row panel, chunk of columns). Within one, the per-column amaxes are gathered
  // first, then every row of the panel is cast with its column's scale (contiguous along rows).
  constexpr int64_t kChunk = 256;
  const int64_t panels = (rows + kMxBlockSize - 1) / kMxBlockSize;
  const int64_t chunks = (cols + kChunk - 1) / kChunk;
#pragma omp parallel for collapse(2) schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t p = 0; p < panels; ++p) {
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t r0 = p * kMxBlockSize, r1 = std::min(rows, r0 + kMxBlockSize);
      const int64_t c0 = ch * kChunk, width = std::min(cols, c0 + kChunk) - c0;
      float inverse[kChunk];  // 2^-shared_exp per column, NaN for a non-finite block
      for (int64_t c = 0; c < width; ++c) {
        const float m = block_amax(data + r0 * cols + c0 + c, r1 - r0, cols);
        inverse[c] = std::isfinite(m) ? inverse_scale(shared_exponent(m, format)) : kNan;
      }
      for (int64_t r = r0; r < r1; ++r) {
        float* row = data + r * cols + c0;
        for (int64_t c = 0; c < width; ++c) {
          // A NaN inverse scale makes the product, and so the element, NaN (as a NaN X does).
          row[c] = Format::decode(Format::encode(row[c] * inverse[c], Overflow::Saturate)) / inverse[c];
        }
      }
    }
  }
}

}  // namespace

void quantize_dequantize_mx_columns(float* data, int64_t rows, int64_t cols, Fp8Format format) {
  if (format == Fp8Format::E4M3) {
    quantize_dequantize_columns<detail::E4M3>(data, rows, cols, format);
  } else {
    quantize_dequantize_columns<detail::E5M2>(data, rows, cols, format);
  }
}

}  // namespace loom::precision
