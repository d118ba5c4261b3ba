#include "loom/kernels/cpu/causal_conv.h"

#include <algorithm>
#include <cmath>

namespace loom::kernels::cpu {
namespace {

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// First token of the window of token t of row b: the row's, or its document's, start.
int64_t window_floor(const ConvShape& s, int64_t b, int64_t t, const int32_t* documents) {
  const int64_t lowest = t - (s.kernel - 1);
  if (!documents) return lowest;
  const int32_t* doc = documents + b * s.seq;
  int64_t first = t;
  while (first > 0 && first > lowest && doc[first - 1] == doc[t]) --first;
  return first;
}

double pre_activation(const ConvShape& s, const float* in, const float* weight, const float* bias, int64_t b,
                      int64_t t, int64_t c, int64_t floor) {
  double acc = bias ? bias[c] : 0.0;
  for (int64_t k = 0; k < s.kernel; ++k) {
    const int64_t src = t - (s.kernel - 1) + k;
    if (src < 0 || src < floor) continue;
    acc += static_cast<double>(weight[c * s.kernel + k]) * in[(b * s.seq + src) * s.in_stride + c];
  }
  return acc;
}

}  // namespace

void causal_conv_silu_forward(float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents) {
#pragma omp parallel for schedule(static) collapse(2)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.seq; ++t) {
      const int64_t floor = window_floor(s, b, t, documents);
      float* o = out + (b * s.seq + t) * s.out_stride;
      for (int64_t c = 0; c < s.channels; ++c) {
        const double v = pre_activation(s, in, weight, bias, b, t, c, floor);
        o[c] = static_cast<float>(v * sigmoid(v));
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
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c_begin = blk * kChannelBlock, c_end = std::min(s.channels, c_begin + kChannelBlock);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t t = 0; t < s.seq; ++t) {
        const int64_t floor = window_floor(s, b, t, documents);
        for (int64_t c = c_begin; c < c_end; ++c) {
          const double v = pre_activation(s, in, weight, bias, b, t, c, floor), sg = sigmoid(v);
          const double g = dout[(b * s.seq + t) * s.out_stride + c] * sg * (1.0 + v * (1.0 - sg));
          if (dbias) dbias[c] += static_cast<float>(g);
          for (int64_t k = 0; k < s.kernel; ++k) {
            const int64_t src = t - (s.kernel - 1) + k;
            if (src < 0 || src < floor) continue;
            const int64_t at = (b * s.seq + src) * s.in_stride + c;
            dweight[c * s.kernel + k] += static_cast<float>(g * in[at]);
            din[at] += static_cast<float>(g * weight[c * s.kernel + k]);
          }
        }
      }
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
        out[(b * s.seq + t) * s.out_stride + c] = static_cast<float>(v * sigmoid(v));
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
      out[b * s.out_stride + c] = static_cast<float>(v * sigmoid(v));
    }
  }
}

}  // namespace loom::kernels::cpu
