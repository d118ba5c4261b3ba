#include "loom/kernels/cuda/causal_conv.h"

#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/slice_sums.h"

namespace loom::kernels::cuda {

namespace {

// First token of the window of token t of row b: the row's, or its document's, start.
__device__ inline int64_t window_floor(const ConvShape& s, int64_t b, int64_t t, const int32_t* documents) {
  const int64_t lowest = t - (s.kernel - 1);
  if (documents == nullptr) return lowest;
  const int32_t* doc = documents + b * s.seq;
  int64_t first = t;
  while (first > 0 && first > lowest && doc[first - 1] == doc[t]) --first;
  return first;
}

__device__ inline double pre_activation(const ConvShape& s, const float* in, const float* weight, const float* bias,
                                        int64_t b, int64_t t, int64_t c, int64_t floor) {
  double acc = bias ? bias[c] : 0.0;
  for (int64_t k = 0; k < s.kernel; ++k) {
    const int64_t src = t - (s.kernel - 1) + k;
    if (src < 0 || src < floor) continue;
    acc += static_cast<double>(weight[c * s.kernel + k]) * in[(b * s.seq + src) * s.in_stride + c];
  }
  return acc;
}

// d(loss)/d(pre-activation) of token t, channel c.
__device__ inline double pre_activation_grad(const ConvShape& s, const float* dout, const float* in,
                                             const float* weight, const float* bias, int64_t b, int64_t t, int64_t c,
                                             int64_t floor) {
  const double v = pre_activation(s, in, weight, bias, b, t, c, floor), sg = sigmoid_of(v);
  return dout[(b * s.seq + t) * s.out_stride + c] * sg * (1.0 + v * (1.0 - sg));
}

__global__ void conv_forward_kernel(float* __restrict__ out, const float* __restrict__ in,
                                    const float* __restrict__ weight, const float* __restrict__ bias, ConvShape s,
                                    const int32_t* __restrict__ documents) {
  const int64_t n = s.batch * s.seq * s.channels;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t c = i % s.channels, bt = i / s.channels, b = bt / s.seq, t = bt % s.seq;
    const double v = pre_activation(s, in, weight, bias, b, t, c, window_floor(s, b, t, documents));
    out[bt * s.out_stride + c] = static_cast<float>(v * sigmoid_of(v));
  }
}

// din of input token `src`: the tokens t = src .. src + kernel - 1 whose windows hold it, in order.
__global__ void conv_input_grad_kernel(float* __restrict__ din, const float* __restrict__ dout,
                                       const float* __restrict__ in, const float* __restrict__ weight,
                                       const float* __restrict__ bias, ConvShape s,
                                       const int32_t* __restrict__ documents) {
  const int64_t n = s.batch * s.seq * s.channels;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t c = i % s.channels, bt = i / s.channels, b = bt / s.seq, src = bt % s.seq;
    float acc = din[bt * s.in_stride + c];
    for (int64_t t = src; t < s.seq && t < src + s.kernel; ++t) {
      const int64_t floor = window_floor(s, b, t, documents);
      if (src < floor) continue;
      const double g = pre_activation_grad(s, dout, in, weight, bias, b, t, c, floor);
      acc += static_cast<float>(g * weight[c * s.kernel + (src - t + s.kernel - 1)]);
    }
    din[bt * s.in_stride + c] = acc;
  }
}

constexpr int kTapsPerPass = 8;

// partial[slice][c * kernel + k] (the weight) and partial[slice][channels * kernel + c] (the
// bias) over the slice's tokens; taps kTapsPerPass at a time.
__global__ void conv_param_grad_kernel(double* __restrict__ partial, const float* __restrict__ dout,
                                       const float* __restrict__ in, const float* __restrict__ weight,
                                       const float* __restrict__ bias, ConvShape s,
                                       const int32_t* __restrict__ documents, int64_t slices) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, slice = blockIdx.y;
  if (c >= s.channels) return;
  const int64_t tokens = s.batch * s.seq, per = (tokens + slices - 1) / slices;
  const int64_t begin = slice * per, end = begin + per < tokens ? begin + per : tokens;
  double* out = partial + slice * s.channels * (s.kernel + 1);
  for (int64_t k0 = 0; k0 < s.kernel; k0 += kTapsPerPass) {
    double taps[kTapsPerPass] = {};
    double bias_sum = 0.0;
    for (int64_t bt = begin; bt < end; ++bt) {
      const int64_t b = bt / s.seq, t = bt % s.seq, floor = window_floor(s, b, t, documents);
      const double g = pre_activation_grad(s, dout, in, weight, bias, b, t, c, floor);
      bias_sum += g;
#pragma unroll
      for (int j = 0; j < kTapsPerPass; ++j) {
        const int64_t k = k0 + j, src = t - (s.kernel - 1) + k;
        if (k < s.kernel && src >= 0 && src >= floor) taps[j] += g * in[(b * s.seq + src) * s.in_stride + c];
      }
    }
    for (int j = 0; j < kTapsPerPass && k0 + j < s.kernel; ++j) out[c * s.kernel + k0 + j] = taps[j];
    if (k0 == 0) out[s.channels * s.kernel + c] = bias_sum;
  }
}

__global__ void conv_step_kernel(float* __restrict__ out, float* __restrict__ window, const int32_t* __restrict__ slots,
                                 const float* __restrict__ in, const float* __restrict__ weight,
                                 const float* __restrict__ bias, ConvShape s) {
  const int64_t past = s.kernel - 1;
  for (int64_t i = grid_start(); i < s.batch * s.channels; i += grid_stride()) {
    const int64_t b = i / s.channels, c = i % s.channels;
    float* w = window + ((slots ? slots[b] : b) * s.channels + c) * past;
    const float x = in[b * s.in_stride + c];
    double v = bias ? bias[c] : 0.0;
    for (int64_t k = 0; k < past; ++k) v += static_cast<double>(weight[c * s.kernel + k]) * w[k];
    v += static_cast<double>(weight[c * s.kernel + past]) * x;
    for (int64_t k = 0; k + 1 < past; ++k) w[k] = w[k + 1];
    if (past > 0) w[past - 1] = x;
    out[b * s.out_stride + c] = static_cast<float>(v * sigmoid_of(v));
  }
}

// A token's input, t from the row's start: the row's, or the window's before it (t in [-past, 0)).
__device__ inline float continued_input(const ConvShape& s, const float* in, const float* w, int64_t b, int64_t t,
                                        int64_t c) {
  return t >= 0 ? in[(b * s.seq + t) * s.in_stride + c] : w[s.kernel - 1 + t];
}

// s.seq > 1 tokens per row after the window's (cpu/causal_conv.cpp: conv_continue): one thread per
// (row, token, channel) reading the window, which the next kernel then shifts.
__global__ void conv_continue_kernel(float* __restrict__ out, const float* __restrict__ window,
                                     const float* __restrict__ in, const float* __restrict__ weight,
                                     const float* __restrict__ bias, ConvShape s) {
  const int64_t n = s.batch * s.seq * s.channels, past = s.kernel - 1;
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const int64_t c = i % s.channels, bt = i / s.channels, b = bt / s.seq, t = bt % s.seq;
    const float* w = window + (b * s.channels + c) * past;
    double v = bias ? bias[c] : 0.0;
    for (int64_t k = 0; k < s.kernel; ++k)
      v += static_cast<double>(weight[c * s.kernel + k]) * continued_input(s, in, w, b, t - past + k, c);
    out[bt * s.out_stride + c] = static_cast<float>(v * sigmoid_of(v));
  }
}

// The window takes the row's last `past` inputs: position k from position k + seq (ascending, so
// every position is read before it is written).
__global__ void conv_window_kernel(float* __restrict__ window, const float* __restrict__ in, ConvShape s) {
  const int64_t past = s.kernel - 1;
  for (int64_t i = grid_start(); i < s.batch * s.channels; i += grid_stride()) {
    const int64_t b = i / s.channels, c = i % s.channels;
    float* w = window + i * past;
    for (int64_t k = 0; k < past; ++k) w[k] = continued_input(s, in, w, b, s.seq - past + k, c);
  }
}

}  // namespace

void causal_conv_silu_forward(float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents, cudaStream_t stream) {
  const int64_t n = s.batch * s.seq * s.channels;
  if (n == 0) return;
  conv_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, in, weight, bias, s, documents);
  check_launch("conv_forward_kernel");
}

void causal_conv_silu_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                               const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents, cudaStream_t stream) {
  const int64_t n = s.batch * s.seq * s.channels;
  if (n == 0) return;
  conv_input_grad_kernel<<<grid_for(n), kThreads, 0, stream>>>(din, dout, in, weight, bias, s, documents);
  check_launch("conv_input_grad_kernel");
  const int64_t width = s.channels * (s.kernel + 1), slices = row_slices(s.batch * s.seq, width);
  Scratch scratch;
  double* partial = scratch.of<double>(slices * width);
  const dim3 grid(static_cast<unsigned>((s.channels + kThreads - 1) / kThreads), static_cast<unsigned>(slices));
  conv_param_grad_kernel<<<grid, kThreads, 0, stream>>>(partial, dout, in, weight, bias, s, documents, slices);
  check_launch("conv_param_grad_kernel");
  add_slice_sums(dweight, partial, slices, s.channels * s.kernel, width, stream);
  if (dbias) add_slice_sums(dbias, partial + s.channels * s.kernel, slices, s.channels, width, stream);
}

void causal_conv_silu_step(float* out, float* window, const int32_t* slots, const float* in, const float* weight,
                           const float* bias, const ConvShape& s, cudaStream_t stream) {
  const int64_t n = s.batch * s.channels;
  if (n == 0) return;
  if (s.seq > 1) {  // a prompt's chunk
    conv_continue_kernel<<<grid_for(n * s.seq), kThreads, 0, stream>>>(out, window, in, weight, bias, s);
    check_launch("conv_continue_kernel");
    conv_window_kernel<<<grid_for(n), kThreads, 0, stream>>>(window, in, s);
    check_launch("conv_window_kernel");
    return;
  }
  conv_step_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, window, slots, in, weight, bias, s);
  check_launch("conv_step_kernel");
}

}  // namespace loom::kernels::cuda
