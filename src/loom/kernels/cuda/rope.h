#pragma once
// Rotary position embedding on the device, in place, with the contract of kernels::cpu::rope_*:
// `heads` heads of table.head_dim columns from column first_col of each row; row r's position is
// positions[r] (device memory) when given, else positions_start + r % seq. cos and sin are the
// RopeTable's [max_positions, head_dim / 2] tables in device memory. Backward rotates by the
// opposite angle. Each product and sum is rounded on its own (no fused multiply-add), the CPU
// loop's arithmetic; the x86-64-v3 CPU build contracts some into FMAs, so the two agree to an ulp
// (the tests ask 1e-6 relative), not bit for bit.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

struct DeviceRopeTable {
  const float* cos;
  const float* sin;
  int64_t head_dim;
};

void rope_forward(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                  int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                  cudaStream_t stream = nullptr);
void rope_backward(float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                   int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                   cudaStream_t stream = nullptr);
// rope_forward on a bf16 tensor (kernels::rope_forward_bf16): the same fp32 arithmetic on the
// widened values, each result rounded to bf16 as it is stored.
void rope_forward_bf16(void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                       int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                       cudaStream_t stream = nullptr);
// rope_backward on a bf16 tensor likewise (bf16 q and k gradients rotated back where they lie).
void rope_backward_bf16(void* dx16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                        int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                        cudaStream_t stream = nullptr);
// rope_backward's result from bf16 gradients written into a zeroed fp32 one: dst [rows, heads x
// head_dim] (dst_stride apart) = rope_backward of (0 + widened src16 rows, src_stride apart), bit
// for bit, in one pass (positions_start 0; Attention's fp32 q/k gradient from cuDNN's bf16 ones).
// `amax` (null: none): the max |value| written taken into it (amax_into's contract).
void rope_backward_widened(float* dst, int64_t dst_stride, const void* src16, int64_t src_stride, int64_t rows,
                           int64_t heads, int64_t seq, const DeviceRopeTable& table, const int32_t* positions,
                           float* amax, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
