#include <cuda_bf16.h>

#include "loom/core/error.h"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/rope.h"

namespace loom::kernels::cuda {

namespace {

// One thread per (row, head, pair i): rotates (v[i], v[i + half]). Rows run along y
// (launch_over_rows over heads * half pairs), so a pair's head and index need only a 32-bit
// division, not three 64-bit ones.
// T: float, or __nv_bfloat16 (widened as loaded, each result rounded as stored).
template <typename T>
__global__ void rope_kernel(T* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                            int64_t positions_start, const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, int64_t half, const int32_t* __restrict__ positions,
                            float direction) {
  const int pairs = static_cast<int>(heads * half), half32 = static_cast<int>(half);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t pos = positions != nullptr ? positions[r] : positions_start + r % seq;
    for (int64_t j = column_start(); j < pairs; j += column_stride()) {
      const int h = static_cast<int>(j) / half32, i = static_cast<int>(j) - h * half32;
      const float c = cos_table[pos * half + i], sn = __fmul_rn(direction, sin_table[pos * half + i]);
      T* v = x + r * row_stride + first_col + static_cast<int64_t>(h) * 2 * half;
      const float a = load(v, i), b = load(v, i + half);
      store(v, i, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
      store(v, i + half, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
    }
  }
}

template <typename T>
void rotate(T* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
            int64_t positions_start, const DeviceRopeTable& t, const int32_t* positions, float direction,
            cudaStream_t stream) {
  const int64_t half = t.head_dim / 2;
  if (rows * heads * half == 0) return;
  LOOM_CHECK(heads * half < (int64_t{1} << 31), "rope: heads x head_dim / 2 must be below 2^31");
  const RowsLaunch l = launch_over_rows(rows, heads * half);
  rope_kernel<<<l.grid, l.block, 0, stream>>>(x, rows, row_stride, first_col, heads, seq, positions_start, t.cos, t.sin,
                                              half, positions, direction);
  check_launch("rope_kernel");
}

}  // namespace

void rope_forward(float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                  int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                  cudaStream_t stream) {
  rotate(x, rows, row_stride, first_col, heads, seq, positions_start, table, positions, 1.0f, stream);
}

void rope_backward(float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                   int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                   cudaStream_t stream) {
  rotate(dx, rows, row_stride, first_col, heads, seq, positions_start, table, positions, -1.0f, stream);
}

void rope_forward_bf16(void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                       int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                       cudaStream_t stream) {
  rotate(static_cast<__nv_bfloat16*>(x16), rows, row_stride, first_col, heads, seq, positions_start, table, positions,
         1.0f, stream);
}

void rope_backward_bf16(void* dx16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
                        int64_t positions_start, const DeviceRopeTable& table, const int32_t* positions,
                        cudaStream_t stream) {
  rotate(static_cast<__nv_bfloat16*>(dx16), rows, row_stride, first_col, heads, seq, positions_start, table, positions,
         -1.0f, stream);
}

}  // namespace loom::kernels::cuda
