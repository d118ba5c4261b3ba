#include "loom/kernels/cpu/half_copies.h"

#include <cstring>
#include <string>

#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"

namespace loom::kernels::cpu {

namespace {

void check_half(DType dtype, const char* op) {
  LOOM_CHECK(dtype == DType::BF16 || dtype == DType::F16,
             std::string("kernels::") + op + ": 16-bit copies are bf16 or f16, not " + dtype_name(dtype));
}

}  // namespace

void narrow_floats(void* dst, const float* src, int64_t n, DType dtype) {
  check_half(dtype, "narrow_floats");
  from_f32(dst, src, n, dtype);
}

void widen_floats(float* dst, const void* src, int64_t n, DType dtype, bool accumulate) {
  check_half(dtype, "widen_floats");
  if (!accumulate) return to_f32(dst, src, n, dtype);
  const auto* bytes = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t bits;  // narrow elements may be unaligned
    std::memcpy(&bits, bytes + 2 * i, sizeof(bits));
    dst[i] += dtype == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  }
}

std::vector<float> widened_bf16(const void* src, int64_t n) {
  std::vector<float> wide(static_cast<size_t>(n));
  widen_floats(wide.data(), src, n, DType::BF16, false);
  return wide;
}

}  // namespace loom::kernels::cpu
