#include "loom/kernels/types.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numbers>

namespace loom::kernels {

namespace {

// Llama 3.1: wavelengths longer than original / low_freq_factor are divided by factor, shorter
// than original / high_freq_factor kept, and those between interpolated smoothly.
double llama3_frequency(double inv_freq, const RopeScaling& s) {
  const double wavelength = 2.0 * std::numbers::pi / inv_freq;
  const double low_freq_wavelength = s.original_max_positions / s.low_freq_factor;
  const double high_freq_wavelength = s.original_max_positions / s.high_freq_factor;
  if (wavelength < high_freq_wavelength) return inv_freq;
  if (wavelength > low_freq_wavelength) return inv_freq / s.factor;
  const double smooth = (s.original_max_positions / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

// YaRN: the dimension whose frequency turns `rotations` times over the original context.
double yarn_correction_dim(double rotations, int64_t head_dim, double theta, double original) {
  return static_cast<double>(head_dim) * std::log(original / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

}  // namespace

std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling) {
  const int64_t half = head_dim / 2;
  std::vector<double> out(half);
  for (int64_t i = 0; i < half; ++i)
    out[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  if (scaling.type == RopeScaling::Type::Llama3) {
    for (double& f : out) f = llama3_frequency(f, scaling);
  } else if (scaling.type == RopeScaling::Type::Yarn) {
    // Dimensions below `low` keep their frequency (extrapolate), above `high` are divided by
    // factor (interpolate), with a linear ramp between (Hugging Face's truncated correction range).
    const double original = scaling.original_max_positions;
    double low = std::max(std::floor(yarn_correction_dim(scaling.beta_fast, head_dim, theta, original)), 0.0);
    double high = std::min(std::ceil(yarn_correction_dim(scaling.beta_slow, head_dim, theta, original)),
                           static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;
      out[i] = out[i] / scaling.factor * (1.0 - extrapolation) + out[i] * extrapolation;
    }
  }
  return out;
}

double rope_attention_factor(const RopeScaling& scaling) {
  if (scaling.type != RopeScaling::Type::Yarn || scaling.factor <= 1.0) return 1.0;
  return 0.1 * std::log(scaling.factor) + 1.0;
}

RopeTable::RopeTable(int64_t max_positions, int64_t head_dim, double theta, const RopeScaling& scaling)
    : head_dim(head_dim) {
  static std::atomic<uint64_t> tables_made{0};
  id = ++tables_made;
  const int64_t half = head_dim / 2;
  const std::vector<double> inv_freq = rope_inverse_frequencies(head_dim, theta, scaling);
  const double attention_factor = rope_attention_factor(scaling);
  cos.resize(max_positions * half);
  sin.resize(max_positions * half);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    for (int64_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(pos) * inv_freq[i];
      cos[pos * half + i] = static_cast<float>(std::cos(angle) * attention_factor);
      sin[pos * half + i] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
}

}  // namespace loom::kernels
