#include "loom/precision/fp8_scaling.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/error.h"
#include "loom/kernels/parallel.h"

namespace loom::precision {

namespace {

// max that lets a NaN through: once the running value is NaN it stays NaN.
inline float nan_max(float running, float value) { return (value > running || value != value) ? value : running; }

float serial_amax(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = nan_max(m, std::fabs(x[i]));
  return m;
}

}  // namespace

float amax(const float* x, int64_t n) {
  if (!kernels::worth_parallel(n)) return serial_amax(x, n);
  // Per-thread partial maxima combined afterwards (max is exact, so any split gives the same value).
  std::vector<float> partial(static_cast<size_t>(omp_get_max_threads()), 0.0f);
#pragma omp parallel
  {
    const int threads = omp_get_num_threads();
    const int t = omp_get_thread_num();
    const int64_t begin = n * t / threads;
    const int64_t end = n * (t + 1) / threads;
    partial[static_cast<size_t>(t)] = serial_amax(x + begin, end - begin);
  }
  float m = 0.0f;
  for (float p : partial) m = nan_max(m, p);
  return m;
}

float compute_scale(float amax_value, float fp8_max, int margin, float previous_scale) {
  if (!(amax_value > 0.0f) || !std::isfinite(amax_value)) return previous_scale;
  const float scale = std::ldexp(fp8_max / amax_value, -margin);
  return std::isinf(scale) ? std::numeric_limits<float>::max() : scale;
}

DelayedScaling::DelayedScaling(Fp8Format format, int history_length, int margin, AmaxAlgorithm algorithm)
    : format_(format), margin_(margin), algorithm_(algorithm) {
  LOOM_CHECK(history_length >= 1, "DelayedScaling: the amax history length must be >= 1, got " +
                                 std::to_string(history_length));
  state_.amax_history.assign(static_cast<size_t>(history_length), 0.0f);
}

void DelayedScaling::update(float tensor_amax) {
  if (!std::isfinite(tensor_amax)) return;
  auto& history = state_.amax_history;
  history[static_cast<size_t>(state_.next)] = tensor_amax;
  state_.next = (state_.next + 1) % static_cast<int64_t>(history.size());
  state_.scale = compute_scale(history_amax(), max_finite(format_), margin_, state_.scale);
}

float DelayedScaling::history_amax() const {
  const auto& history = state_.amax_history;
  if (algorithm_ == AmaxAlgorithm::MostRecent) {
    const int64_t size = static_cast<int64_t>(history.size());
    return history[static_cast<size_t>((state_.next + size - 1) % size)];
  }
  return *std::max_element(history.begin(), history.end());
}

void DelayedScaling::restore(const DelayedScalingState& state) {
  LOOM_CHECK(state.amax_history.size() == state_.amax_history.size(),
        "DelayedScaling::restore: the amax history has " + std::to_string(state.amax_history.size()) +
            " entries, this tensor's recipe keeps " + std::to_string(state_.amax_history.size()));
  LOOM_CHECK(state.next >= 0 && state.next < static_cast<int64_t>(state.amax_history.size()),
        "DelayedScaling::restore: history position " + std::to_string(state.next) + " out of range");
  LOOM_CHECK(state.scale > 0.0f && std::isfinite(state.scale),
        "DelayedScaling::restore: the scale must be finite and > 0, got " + std::to_string(state.scale));
  state_ = state;
}

float CurrentScaling::scale_for(const float* x, int64_t n) const {
  return compute_scale(amax(x, n), max_finite(format_), margin_, 1.0f);
}

float CurrentScaling::quantize_dequantize(float* x, int64_t n) const {
  const float scale = scale_for(x, n);
  quantize_dequantize_fp8(x, n, format_, scale);
  return scale;
}

float block_scale(float block_amax, Fp8Format format) {
  return compute_scale(block_amax, max_finite(format), 0, 1.0f);
}

void quantize_dequantize_rowwise_blocks(float* x, int64_t rows, int64_t cols, Fp8Format format, int64_t block,
                                        float* scales) {
  LOOM_CHECK(rows >= 0 && cols >= 0 && block >= 1, "quantize_dequantize_rowwise_blocks: bad shape or block size");
  const int64_t blocks_per_row = (cols + block - 1) / block;
#pragma omp parallel for schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < blocks_per_row; ++b) {
      float* run = x + r * cols + b * block;
      const int64_t length = std::min(block, cols - b * block);
      const float scale = block_scale(serial_amax(run, length), format);
      detail::quantize_dequantize_span(run, length, format, scale, Overflow::Saturate);
      if (scales) scales[r * blocks_per_row + b] = scale;
    }
  }
}

void quantize_dequantize_tile_blocks(float* w, int64_t rows, int64_t cols, Fp8Format format, int64_t tile,
                                     float* scales) {
  LOOM_CHECK(rows >= 0 && cols >= 0 && tile >= 1, "quantize_dequantize_tile_blocks: bad shape or tile size");
  const int64_t tile_rows = (rows + tile - 1) / tile;
  const int64_t tile_cols = (cols + tile - 1) / tile;
#pragma omp parallel for collapse(2) schedule(static) if (kernels::worth_parallel(rows * cols))
  for (int64_t tr = 0; tr < tile_rows; ++tr) {
    for (int64_t tc = 0; tc < tile_cols; ++tc) {
      const int64_t r0 = tr * tile, r1 = std::min(rows, r0 + tile);
      const int64_t c0 = tc * tile, width = std::min(cols, c0 + tile) - c0;
      float m = 0.0f;
      for (int64_t r = r0; r < r1; ++r) m = nan_max(m, serial_amax(w + r * cols + c0, width));
      const float scale = block_scale(m, format);
      for (int64_t r = r0; r < r1; ++r) {
        detail::quantize_dequantize_span(w + r * cols + c0, width, format, scale, Overflow::Saturate);
      }
      if (scales) scales[tr * tile_cols + tc] = scale;
    }
  }
}

}  // namespace loom::precision
