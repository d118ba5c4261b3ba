#include "loom/kernels/cpu/causal_conv.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/fast_math.h"

namespace loom::kernels::cpu {
namespace {

// First token of the window of token t of row b: the row's, or its document's, start.
int64_t window_floor(const ConvShape& s, int64_t b, int64_t t, const int32_t* documents) {
  const int64_t lowest = t - (s.kernel - 1);
  if (!documents) return lowest;
  const int32_t* doc = documents + b * s.seq;
  int64_t first = t;
  while (first > 0 && first > lowest && doc[first - 1] == doc[t]) --first;
  return first;
}

// The weights tap by tap ([kernel, channels]), so that a tap's products run over adjacent channels.
std::vector<float> taps_of(const float* weight, const ConvShape& s) {
  std::vector<float> taps(static_cast<size_t>(s.kernel * s.channels));
  for (int64_t c = 0; c < s.channels; ++c)
    for (int64_t k = 0; k < s.kernel; ++k) taps[k * s.channels + c] = weight[c * s.kernel + k];
  return taps;
}

// acc[i] = the pre-activation of channel c0 + i of token t (i < width): the bias, then the taps in
// order over the window's inputs at or past `floor`.
void pre_activations(double* acc, const ConvShape& s, const float* in, const std::vector<float>& taps,
                     const float* bias, int64_t b, int64_t t, int64_t floor, int64_t c0, int64_t width) {
#pragma omp simd
  for (int64_t i = 0; i < width; ++i) acc[i] = bias ? bias[c0 + i] : 0.0;
  for (int64_t k = 0; k < s.kernel; ++k) {
    const int64_t src = t - (s.kernel - 1) + k;
    if (src < 0 || src < floor) continue;
    const float* row = in + (b * s.seq + src) * s.in_stride + c0;
    const float* tap = taps.data() + k * s.channels + c0;
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) acc[i] += static_cast<double>(tap[i]) * row[i];
  }
}

}  // namespace

void causal_conv_silu_forward(float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents) {
  const std::vector<float> taps = taps_of(weight, s);
#pragma omp parallel
  {
    std::vector<double> acc(static_cast<size_t>(s.channels));
#pragma omp for schedule(static) collapse(2)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq; ++t) {
        pre_activations(acc.data(), s, in, taps, bias, b, t, window_floor(s, b, t, documents), 0, s.channels);
        float* o = out + (b * s.seq + t) * s.out_stride;
#pragma omp simd
        for (int64_t c = 0; c < s.channels; ++c) o[c] = static_cast<float>(acc[c] * fast_sigmoid(acc[c]));
      }
    }
  }
}

void causal_conv_silu_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                               const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents) {
  // Parallel over blocks of channels: each thread owns its channels' parameter and input
  // gradients and walks the tokens in order (each channel's sums in the same order whatever the
  // threads), over a block of adjacent channels so that every row is read a cache line at a time.
  constexpr int64_t kChannelBlock = 16;
  const int64_t blocks = (s.channels + kChannelBlock - 1) / kChannelBlock;
  const std::vector<float> taps = taps_of(weight, s);
#pragma omp parallel
  {
    std::vector<float> dtaps(static_cast<size_t>(s.kernel * kChannelBlock));  // the block's dweight, tap by tap
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t c0 = blk * kChannelBlock, width = std::min(s.channels - c0, kChannelBlock);
      for (int64_t i = 0; i < width; ++i)
        for (int64_t k = 0; k < s.kernel; ++k) dtaps[k * kChannelBlock + i] = dweight[(c0 + i) * s.kernel + k];
      double g[kChannelBlock];
      for (int64_t b = 0; b < s.batch; ++b) {
        for (int64_t t = 0; t < s.seq; ++t) {
          const int64_t floor = window_floor(s, b, t, documents);
          pre_activations(g, s, in, taps, bias, b, t, floor, c0, width);
          const float* d = dout + (b * s.seq + t) * s.out_stride + c0;
#pragma omp simd
          for (int64_t i = 0; i < width; ++i) {
            const double v = g[i], sg = fast_sigmoid(v);
            g[i] = d[i] * sg * (1.0 + v * (1.0 - sg));
          }
          if (dbias) {
#pragma omp simd
            for (int64_t i = 0; i < width; ++i) dbias[c0 + i] += static_cast<float>(g[i]);
          }
          for (int64_t k = 0; k < s.kernel; ++k) {
            const int64_t src = t - (s.kernel - 1) + k;
            if (src < 0 || src < floor) continue;
            const float* x = in + (b * s.seq + src) * s.in_stride + c0;
            float* dx = din + (b * s.seq + src) * s.in_stride + c0;
            const float* tap = taps.data() + k * s.channels + c0;
            float* dtap = dtaps.data() + k * kChannelBlock;
#pragma omp simd
            for (int64_t i = 0; i < width; ++i) {
              dtap[i] += static_cast<float>(g[i] * x[i]);
              dx[i] += static_cast<float>(g[i] * tap[i]);
            }
          }
        }
      }
      for (int64_t i = 0; i < width; ++i)
        for (int64_t k = 0; k < s.kernel; ++k) dweight[(c0 + i) * s.kernel + k] = dtaps[k * kChannelBlock + i];
    }
  }
}

namespace {

// s.seq > 1 tokens per row after the window's: each token's window reads the row's earlier inputs,
// then the window's; the window then holds the row's last kernel - 1 inputs (its own oldest ones
// too where the row is shorter), shifted in place oldest first (position k takes position k + seq).
void conv_continue(float* out, float* window, const float* in, const float* weight, const float* bias,
                   const ConvShape& s) {
  const int64_t past = s.kernel - 1;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t c = 0; c < s.channels; ++c) {
      float* w = window + (b * s.channels + c) * past;
      auto input = [&](int64_t t) { return t >= 0 ? in[(b * s.seq + t) * s.in_stride + c] : w[past + t]; };
      for (int64_t t = 0; t < s.seq; ++t) {
        double v = bias ? bias[c] : 0.0;
        for (int64_t k = 0; k < s.kernel; ++k) v += static_cast<double>(weight[c * s.kernel + k]) * input(t - past + k);
        out[(b * s.seq + t) * s.out_stride + c] = static_cast<float>(v * fast_sigmoid(v));
      }
      for (int64_t k = 0; k < past; ++k) w[k] = input(s.seq - past + k);
    }
  }
}

}  // namespace

void causal_conv_silu_step(float* out, float* window, const int32_t* slots, const float* in, const float* weight,
                           const float* bias, const ConvShape& s) {
  if (s.seq > 1) return conv_continue(out, window, in, weight, bias, s);
  const int64_t past = s.kernel - 1;
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t c = 0; c < s.channels; ++c) {
      float* w = window + ((slots ? slots[b] : b) * s.channels + c) * past;
      const float x = in[b * s.in_stride + c];
      double v = bias ? bias[c] : 0.0;
      for (int64_t k = 0; k < past; ++k) v += static_cast<double>(weight[c * s.kernel + k]) * w[k];
      v += static_cast<double>(weight[c * s.kernel + past]) * x;
      for (int64_t k = 0; k + 1 < past; ++k) w[k] = w[k + 1];
      if (past > 0) w[past - 1] = x;
      out[b * s.out_stride + c] = static_cast<float>(v * fast_sigmoid(v));
    }
  }
}

}  // namespace loom::kernels::cpu
