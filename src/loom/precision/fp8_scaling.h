#pragma once
// Scaling factors for FP8 tensors, as TransformerEngine computes them. A tensor x is cast as
// fp8(x * scale) and read back as fp8 / scale, the scale chosen so the tensor's largest magnitude
// (amax) lands near the format's largest finite value.
//
// - Per-tensor delayed scaling (TE DelayedScaling, Hopper): the scale used now comes from the
//   amaxes of the last H uses of that tensor (max over the window, or the most recent one).
// - Per-tensor current scaling (TE Float8CurrentScaling): the scale comes from the tensor's own
//   amax, measured just before the cast. One more pass over the data, no stale history.
// - Blockwise (TE Float8BlockScaling, the DeepSeek-V3 recipe): one scale per 1x128 run of a row
//   for activations and gradients, one per 128x128 tile for weights, so an outlier only costs
//   precision in its own block.
#include <cstdint>
#include <vector>

#include "loom/precision/formats.h"

namespace loom::precision {

// max |x_i| over n elements (0 for n == 0). Nothing is skipped: a NaN anywhere makes the result
// NaN and an Inf makes it Inf, so the caller (loss scaler, scale update) can notice.
float amax(const float* x, int64_t n);

// (fp8_max / amax) / 2^margin. A zero or non-finite amax says nothing about the range, so the
// previous scale is kept (TE does the same); a scale that overflows fp32 (amax tiny) becomes
// FLT_MAX (also as TE).
float compute_scale(float amax, float fp8_max, int margin = 0, float previous_scale = 1.0f);

enum class AmaxAlgorithm : uint8_t { Max, MostRecent };

// What a checkpoint keeps of one tensor's delayed scaling.
struct DelayedScalingState {
  std::vector<float> amax_history;  // ring buffer, length H
  int64_t next = 0;                 // slot the next amax goes to
  float scale = 1.0f;
};

// Per-tensor delayed scaling. Use: quantize with scale(), then update(amax of what was quantized,
// measured before the cast). The scale starts at 1 and the history at zeros.
//
// A non-finite amax is not recorded (deliberate, unlike TE): the loss scaler skips that step, and
// one Inf in the window would otherwise freeze the scale for H steps.
class DelayedScaling {
 public:
  explicit DelayedScaling(Fp8Format format, int history_length = 1024, int margin = 0,
                          AmaxAlgorithm algorithm = AmaxAlgorithm::Max);

  float scale() const { return state_.scale; }
  float scale_inverse() const { return 1.0f / state_.scale; }
  Fp8Format format() const { return format_; }
  void update(float tensor_amax);
  // The amax the current scale came from: max over the window, or the most recent entry.
  float history_amax() const;

  const DelayedScalingState& state() const { return state_; }
  void restore(const DelayedScalingState& state);  // checks the history length

 private:
  Fp8Format format_;
  int margin_;
  AmaxAlgorithm algorithm_;
  DelayedScalingState state_;
};

// Per-tensor current scaling: the scale from the tensor itself (previous scale 1).
class CurrentScaling {
 public:
  explicit CurrentScaling(Fp8Format format, int margin = 0) : format_(format), margin_(margin) {}
  float scale_for(const float* x, int64_t n) const;
  // Quantize-dequantize x in place with its own scale; returns the scale used.
  float quantize_dequantize(float* x, int64_t n) const;
  Fp8Format format() const { return format_; }

 private:
  Fp8Format format_;
  int margin_;
};

// Blockwise scales: fp8_max / amax(block) in fp32; a block with amax 0 (or non-finite) gets 1.
constexpr int64_t kBlockwiseSize = 128;
float block_scale(float block_amax, Fp8Format format);

// Row-major [rows, cols]; one scale per 1 x block run along each row (the last run of a row may
// be shorter). scales, if given, receives rows * ceil(cols / block) values, row-major.
void quantize_dequantize_rowwise_blocks(float* x, int64_t rows, int64_t cols,
                                        Fp8Format format = Fp8Format::E4M3, int64_t block = kBlockwiseSize,
                                        float* scales = nullptr);

// Row-major [rows, cols]; one scale per tile x tile square (ragged at the right and bottom edges).
// scales, if given, receives ceil(rows / tile) * ceil(cols / tile) values, row-major by tile.
void quantize_dequantize_tile_blocks(float* w, int64_t rows, int64_t cols, Fp8Format format = Fp8Format::E4M3,
                                     int64_t tile = kBlockwiseSize, float* scales = nullptr);

}  // namespace loom::precision
