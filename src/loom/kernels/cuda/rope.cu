#include <cuda_bf16.h>

#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/rope.h"

namespace loom::kernels::cuda {

namespace {

// One thread per (row, head, pair i): rotates (v[i], v[i + half]) of src's row into dst's (the
// same memory in place). Rows run along y (launch_over_rows over heads * half pairs), so a pair's
// head and index need only a 32-bit division, not three 64-bit ones.
// Src, Dst: float, or __nv_bfloat16 (widened as loaded, each result rounded as stored). From bf16
// into fp32 (a gradient written whole) each loaded value is first added to 0, as an add into a
// zeroed fp32 gradient leaves it (-0 becomes +0), so the result is that gradient rotated in place.
template <typename Src, typename Dst>
__global__ void rope_kernel(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows,
                            int64_t heads, int64_t seq, int64_t positions_start, const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, int64_t half, const int32_t* __restrict__ positions,
                            float direction) {
  constexpr bool kFromZero = !std::is_same_v<Src, Dst>;
  const int pairs = static_cast<int>(heads * half), half32 = static_cast<int>(half);
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t pos = positions != nullptr ? positions[r] : positions_start + r % seq;
    for (int64_t j = column_start(); j < pairs; j += column_stride()) {
      const int h = static_cast<int>(j) / half32, i = static_cast<int>(j) - h * half32;
      const float c = cos_table[pos * half + i], sn = __fmul_rn(direction, sin_table[pos * half + i]);
      const int64_t head = static_cast<int64_t>(h) * 2 * half;
      const Src* u = src + r * src_stride + head;
      Dst* v = dst + r * dst_stride + head;
      float a = load(u, i), b = load(u, i + half);
      if constexpr (kFromZero) {
        a = __fadd_rn(0.0f, a);
        b = __fadd_rn(0.0f, b);
      }
      store(v, i, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
      store(v, i + half, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
    }
  }
}

template <typename Src, typename Dst>
void rotate(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows, int64_t heads,
            int64_t seq, int64_t positions_start, const DeviceRopeTable& t, const int32_t* positions, float direction,
            cudaStream_t stream) {
  const int64_t half = t.head_dim / 2;
  if (rows * heads * half == 0) return;
  LOOM_CHECK(heads * half < (int64_t{1} << 31), "rope: heads x head_dim / 2 must be below 2^31");
  const RowsLaunch l = launch_over_rows(rows, heads * half);
  rope_kernel<<<l.grid, l.block, 0, stream>>>(src, src_stride, dst, dst_stride, rows, heads, seq, positions_start,
                                              t.cos, t.sin, half, positions, direction);
  check_launch("rope_kernel");
}

// In place on x's heads from column first_col.
template <typename T>
void rotate(T* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads, int64_t seq,
            int64_t positions_start, const DeviceRopeTable& t, const int32_t* positions, float direction,
            cudaStream_t stream) {
  rotate(x + first_col, row_stride, x + first_col, row_stride, rows, heads, seq, positions_start, t, positions,
         direction, stream);
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

void rope_backward_widened(float* dst, int64_t dst_stride, const void* src16, int64_t src_stride, int64_t rows,
                           int64_t heads, int64_t seq, const DeviceRopeTable& table, const int32_t* positions,
                           cudaStream_t stream) {
  rotate(static_cast<const __nv_bfloat16*>(src16), src_stride, dst, dst_stride, rows, heads, seq, 0, table, positions,
         -1.0f, stream);
}

}  // namespace loom::kernels::cuda
