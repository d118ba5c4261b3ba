#pragma once
// Mamba's short causal depthwise convolution followed by SiLU, over [batch, seq] tokens of
// `channels` channels: out[t, c] = silu(bias[c] + sum_k weight[c, k] in[t - (kernel-1) + k, c]),
// the window reading zeros before the row's start and before the token's document start
// (`documents` [batch, seq], null = one document per row). in / out rows are in_stride /
// out_stride floats apart.
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

void causal_conv_silu_forward(float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents);
// Adds into din, dweight, dbias (each channel's parameter gradient summed over tokens in order).
void causal_conv_silu_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                               const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents);
// s.seq more tokens of each of s.batch sequences: window [batch, channels, kernel-1] holds each
// channel's previous inputs (oldest first), read where a token's window reaches before the row's
// start, and is shifted to take the row's inputs (one token: decoding; more: a prompt's chunk).
// `slots` (one token per row only): row b's window is the slots[b]-th of `window` instead of the b-th.
void causal_conv_silu_step(float* out, float* window, const int32_t* slots, const float* in, const float* weight,
                           const float* bias, const ConvShape& s);

}  // namespace loom::kernels::cpu
