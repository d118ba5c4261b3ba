#pragma once
// Test data for collectives: random values exactly representable in a dtype, their bytes, and the
// comparison of a backend's results with the double reference (serial_reference.h).
//
// Tolerances, for a reduction over `ranks` inputs with element-wise s = sum of |x| (for Avg,
// divided by ranks) and reference value v:
//   f32:  1e-6 * s                      (f32 accumulation of <= 8 terms: < 8 * 2^-24 * s)
//   bf16: 2^-8 * |v| + 2e-6 * s         (one rounding to 8 significant bits, after f32 accumulation)
//   f16:  2^-11 * |v| + 2e-6 * s + 2^-24 (one rounding to 11 bits; 2^-24 covers f16 subnormals)
//   Max:  exact (the result is one of the inputs)
// Collectives that only move data must be bit-exact.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/reduce.h"
#include "loom/core/dtype.h"

namespace loom::comm::testing {

inline uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a cheap, well-spread hash
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline double round_to(double value, DType dtype) {
  const auto f = static_cast<float>(value);
  switch (dtype) {
    case DType::BF16: return bf16_to_f32(f32_to_bf16(f));
    case DType::F16: return f16_to_f32(f32_to_f16(f));
    case DType::F32: return f;
    default: return value;  // integer dtypes: the tests use small integers, exact in double
  }
}

// `count` values uniform in [-1, 1) (integers in [-1000, 1000) for integer dtypes), exactly
// representable in `dtype`, determined by `seed`.
inline std::vector<double> random_values(int64_t count, DType dtype, uint64_t seed) {
  std::vector<double> values(count);
  const uint64_t base = mix(seed);
  const bool integer = !reducible(dtype);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t h = mix(base + static_cast<uint64_t>(i));
    values[i] = integer ? static_cast<double>(static_cast<int64_t>(h % 2000) - 1000)
                        : round_to(static_cast<double>(h >> 40) * 0x1p-23 - 1.0, dtype);
  }
  return values;
}

inline std::vector<std::byte> encode(const std::vector<double>& values, DType dtype) {
  const size_t element = dtype_size(dtype);
  std::vector<std::byte> bytes(values.size() * element);
  for (size_t i = 0; i < values.size(); ++i) {
    std::byte* at = bytes.data() + i * element;
    const auto f = static_cast<float>(values[i]);
    switch (dtype) {
      case DType::F32: std::memcpy(at, &f, 4); break;
      case DType::BF16: { const uint16_t b = f32_to_bf16(f); std::memcpy(at, &b, 2); break; }
      case DType::F16: { const uint16_t h = f32_to_f16(f); std::memcpy(at, &h, 2); break; }
      case DType::I32: { const auto v = static_cast<int32_t>(values[i]); std::memcpy(at, &v, 4); break; }
      case DType::I64: { const auto v = static_cast<int64_t>(values[i]); std::memcpy(at, &v, 8); break; }
      default: throw std::invalid_argument("encode: unsupported test dtype " + dtype_name(dtype));
    }
  }
  return bytes;
}

inline std::vector<double> decode(const void* data, int64_t count, DType dtype) {
  const size_t element = dtype_size(dtype);
  const auto* bytes = static_cast<const std::byte*>(data);
  std::vector<double> values(count);
  for (int64_t i = 0; i < count; ++i) {
    const std::byte* at = bytes + i * element;
    switch (dtype) {
      case DType::F32: { float f; std::memcpy(&f, at, 4); values[i] = f; break; }
      case DType::BF16: { uint16_t b; std::memcpy(&b, at, 2); values[i] = bf16_to_f32(b); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, at, 2); values[i] = f16_to_f32(h); break; }
      case DType::I32: { int32_t v; std::memcpy(&v, at, 4); values[i] = v; break; }
      case DType::I64: { int64_t v; std::memcpy(&v, at, 8); values[i] = static_cast<double>(v); break; }
      default: throw std::invalid_argument("decode: unsupported test dtype " + dtype_name(dtype));
    }
  }
  return values;
}

inline std::vector<double> decode(const std::vector<std::byte>& bytes, DType dtype) {
  return decode(bytes.data(), static_cast<int64_t>(bytes.size() / dtype_size(dtype)), dtype);
}

inline double tolerance(DType dtype, ReduceOp op, double reference, double abs_sum, int ranks) {
  if (op == ReduceOp::Max) return 0.0;
  const double s = op == ReduceOp::Avg ? abs_sum / ranks : abs_sum;
  switch (dtype) {
    case DType::BF16: return 0x1p-8 * std::abs(reference) + 2e-6 * s;
    case DType::F16: return 0x1p-11 * std::abs(reference) + 2e-6 * s + 0x1p-24;
    default: return 1e-6 * s;
  }
}

// "" when every element of `got` is within tolerance of `want`, else the first few misses.
inline std::string compare_reduced(const std::vector<double>& got, const std::vector<double>& want,
                                   const std::vector<double>& abs_sum, DType dtype, ReduceOp op, int ranks) {
  if (got.size() != want.size()) {
    return "length " + std::to_string(got.size()) + " instead of " + std::to_string(want.size());
  }
  std::string misses;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 5; ++i) {
    const double tol = tolerance(dtype, op, want[i], abs_sum[i], ranks);
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      misses += "[" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) +
                " (tolerance " + std::to_string(tol) + "); ";
      ++shown;
    }
  }
  return misses;
}

// "" when `got` equals `want` exactly, else the first few differences.
inline std::string compare_exact(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) {
    return "length " + std::to_string(got.size()) + " instead of " + std::to_string(want.size());
  }
  std::string misses;
  int shown = 0;
  for (size_t i = 0; i < got.size() && shown < 5; ++i) {
    if (got[i] != want[i]) {
      misses += "[" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " + std::to_string(want[i]) + "; ";
      ++shown;
    }
  }
  return misses;
}

}  // namespace loom::comm::testing
