#pragma once
// Independent references for the format tests: decoding by the textbook formula in double, and
// encoding by searching all finite values for the nearest one. Slow and obviously right, so the
// bit-twiddling casts in formats.h are checked against something that shares none of their code.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace loom::precision::testing {

struct FormatSpec {
  const char* name;
  int bits;          // 8 or 16
  int exponent_bits;
  int mantissa_bits;
  int bias;
  bool ieee_specials;  // all-ones exponent = Inf (mantissa 0) / NaN; else only S.1..1.1..1 is NaN (E4M3)
};

constexpr FormatSpec kE4M3{"e4m3", 8, 4, 3, 7, false};
constexpr FormatSpec kE5M2{"e5m2", 8, 5, 2, 15, true};
constexpr FormatSpec kFp16{"fp16", 16, 5, 10, 15, true};
constexpr FormatSpec kBf16{"bf16", 16, 8, 7, 127, true};

// sign * 2^(e - bias) * (1 + m / 2^M), or sign * 2^(1 - bias) * m / 2^M for e == 0.
inline double reference_decode(const FormatSpec& f, uint32_t code) {
  const uint32_t sign = (code >> (f.bits - 1)) & 1u;
  const uint32_t e = (code >> f.mantissa_bits) & ((1u << f.exponent_bits) - 1u);
  const uint32_t m = code & ((1u << f.mantissa_bits) - 1u);
  const uint32_t e_all_ones = (1u << f.exponent_bits) - 1u;
  const double s = sign ? -1.0 : 1.0;
  if (f.ieee_specials && e == e_all_ones) {
    return m == 0 ? s * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  }
  if (!f.ieee_specials && e == e_all_ones && m == (1u << f.mantissa_bits) - 1u) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double fraction = static_cast<double>(m) / std::ldexp(1.0, f.mantissa_bits);
  if (e == 0) return s * std::ldexp(fraction, 1 - f.bias);
  return s * std::ldexp(1.0 + fraction, static_cast<int>(e) - f.bias);
}

inline bool is_nan_code(const FormatSpec& f, uint32_t code) { return std::isnan(reference_decode(f, code)); }

// Magnitude codes of all finite non-negative values, ascending (codes and values grow together).
inline std::vector<uint32_t> finite_magnitude_codes(const FormatSpec& f) {
  std::vector<uint32_t> out;
  for (uint32_t c = 0; c < (1u << (f.bits - 1)); ++c) {
    if (std::isfinite(reference_decode(f, c))) out.push_back(c);
  }
  return out;
}

// Nearest finite value, ties to the even code; saturating (past the largest value -> it).
// x finite. Sign of the result is x's sign (zero keeps it).
inline uint32_t reference_encode_saturating(const FormatSpec& f, double x) {
  const uint32_t sign = std::signbit(x) ? (1u << (f.bits - 1)) : 0u;
  const double a = std::fabs(x);
  static thread_local std::vector<uint32_t> codes;
  static thread_local const FormatSpec* cached = nullptr;
  if (cached != &f) {
    codes = finite_magnitude_codes(f);
    cached = &f;
  }
  uint32_t best = codes[0];
  double best_distance = std::numeric_limits<double>::infinity();
  for (uint32_t c : codes) {
    const double d = std::fabs(reference_decode(f, c) - a);
    if (d < best_distance || (d == best_distance && (c & 1u) == 0u)) {
      best = c;
      best_distance = d;
    }
  }
  return sign | best;
}

}  // namespace loom::precision::testing
