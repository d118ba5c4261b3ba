#pragma once
// Mamba-2's selective state-space scan in its chunked (SSD) form, per head h:
//   dt_t = softplus(dt_raw_t + dt_bias_h),  A_h = -exp(A_log_h)
//   S_t  = exp(dt_t A_h) S_{t-1} + dt_t x_t B_t^T        (S: [head_dim, state])
//   y_t  = S_t C_t + D_h x_t
// computed per block of `chunk` tokens: inside a block as the masked quadratic form
// y_t = sum_{s<=t} exp(cum_t - cum_s) (C_t . B_s) dt_s x_s + exp(cum_t) S_in C_t + D x_t
// (cum = running sum of dt A in the block), the state carried from block to block. A block also
// ends at a document boundary, where the state restarts at zero (`documents`: [batch, seq] ids,
// null = one document per row). Shapes and strides: kernels/types.h (SsdShape).
#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cpu {

void ssd_scan_forward(float* y, const float* x, const float* dt_raw, const float* dt_bias, const float* A_log,
                      const float* B, const float* C, const float* D, const SsdShape& s, const int32_t* documents);
// Adds into every gradient; the per-head parameter gradients are summed over the batch in a
// fixed order (deterministic).
void ssd_scan_backward(float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC, float* dD,
                       const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                       const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                       const int32_t* documents);
// s.seq more tokens of each of s.batch sequences: state [batch, heads, head_dim, state] is
// advanced by them and y written. One token (decoding): the recurrence itself; more (a prompt's
// chunk): the chunked scan continuing from the state, which then holds the state after the
// row's last token (rounded to fp32 once, where token by token it is rounded at every token).
// `slots` (one token per row only): row b's state is the slots[b]-th of `state` instead of the b-th.
void ssd_scan_step(float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s);

}  // namespace loom::kernels::cpu
