#include <cuda_bf16.h>

#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/rope.h"

namespace loom::kernels::cuda {

namespace {

// Row r's position: positions[r], else positions_start + r % seq (a 32-bit remainder where r and
// seq allow: a 64-bit one costs a long subroutine).
__device__ inline int64_t row_position(int64_t r, const int32_t* positions, int64_t positions_start, int64_t seq) {
  if (positions != nullptr) return positions[r];
  if (((r | seq) >> 32) == 0) return positions_start + static_cast<uint32_t>(r) % static_cast<uint32_t>(seq);
  return positions_start + r % seq;
}

// One thread per (row, head, pair i): rotates (v[i], v[i + half]) of src's row into dst's (the
// same memory in place). Rows run along y (launch_over_rows over heads * half pairs), so a pair's
// head and index need only a 32-bit division, not three 64-bit ones.
// Src, Dst: float, or __nv_bfloat16 (widened as loaded, each result rounded as stored). From bf16
// into fp32 (a gradient written whole) each loaded value is first added to 0, as an add into a
// zeroed fp32 gradient leaves it (-0 becomes +0), so the result is that gradient rotated in place.
// With `amax` (not null) the max |value| stored is taken into it (amax.cuh: one atomic per block,
// the grid capped by the launch).
template <typename Src, typename Dst>
__global__ void rope_kernel(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows,
                            int64_t heads, int64_t seq, int64_t positions_start, const float* __restrict__ cos_table,
                            const float* __restrict__ sin_table, int64_t half, const int32_t* __restrict__ positions,
                            float direction, unsigned* amax) {
  constexpr bool kFromZero = !std::is_same_v<Src, Dst>;
  const int pairs = static_cast<int>(heads * half), half32 = static_cast<int>(half);
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t pos = row_position(r, positions, positions_start, seq);
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
      const float x = store(v, i, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
      const float y = store(v, i + half, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
      if (amax != nullptr) m = nan_max(nan_max(m, fabsf(x)), fabsf(y));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// rope_kernel four pairs at a time (with half a multiple of 4, both strides multiples of 4 and
// every pointer, the tables' too, pack-aligned): each half's four values and the tables' four
// entries are one aligned access each (pack4.cuh). A thread per (row, pairs i..i+3, kRopeHeads
// heads): the row's cos and sin read once for all its heads, and all its heads' loads issued
// before their arithmetic, so it keeps them in flight. The same arithmetic per pair, so the same
// bits; the same amax.
constexpr int kRopeHeads = 4;
template <typename Src, typename Dst>
__global__ void rope4_kernel(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows,
                             int64_t heads, int64_t seq, int64_t positions_start, const float* __restrict__ cos_table,
                             const float* __restrict__ sin_table, int64_t half, const int32_t* __restrict__ positions,
                             float direction, unsigned* amax) {
  constexpr bool kFromZero = !std::is_same_v<Src, Dst>;
  float m = 0.0f;
  const int head_packs = static_cast<int>(half / 4), heads32 = static_cast<int>(heads);
  const int packs = (heads32 + kRopeHeads - 1) / kRopeHeads * head_packs;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t pos = row_position(r, positions, positions_start, seq);
    for (int64_t j = column_start(); j < packs; j += column_stride()) {
      const int g = static_cast<int>(j) / head_packs, p = static_cast<int>(j) - g * head_packs;
      float c[4], sn[4], a[kRopeHeads][4], b[kRopeHeads][4];
      load4(cos_table + pos * half, p, c);
      load4(sin_table + pos * half, p, sn);
#pragma unroll
      for (int q = 0; q < kRopeHeads; ++q) {
        const int h = g * kRopeHeads + q;
        if (h >= heads32) break;
        const Src* u = src + r * src_stride + h * 2 * half;
        load4(u, p, a[q]);
        load4(u + half, p, b[q]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sn[k] = __fmul_rn(direction, sn[k]);
#pragma unroll
      for (int q = 0; q < kRopeHeads; ++q) {
        const int h = g * kRopeHeads + q;
        if (h >= heads32) break;
        float x[4], y[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          float ak = a[q][k], bk = b[q][k];
          if constexpr (kFromZero) {
            ak = __fadd_rn(0.0f, ak);
            bk = __fadd_rn(0.0f, bk);
          }
          x[k] = __fsub_rn(__fmul_rn(ak, c[k]), __fmul_rn(bk, sn[k]));
          y[k] = __fadd_rn(__fmul_rn(bk, c[k]), __fmul_rn(ak, sn[k]));
        }
        Dst* v = dst + r * dst_stride + h * 2 * half;
        m = nan_max(m, store4(v, p, x));
        m = nan_max(m, store4(v + half, p, y));
      }
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <typename Src, typename Dst>
void rotate(const Src* src, int64_t src_stride, Dst* dst, int64_t dst_stride, int64_t rows, int64_t heads,
            int64_t seq, int64_t positions_start, const DeviceRopeTable& t, const int32_t* positions, float direction,
            cudaStream_t stream, float* amax = nullptr) {
  const int64_t half = t.head_dim / 2;
  auto* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (rows * heads * half == 0) return;
  LOOM_CHECK(heads * half < (int64_t{1} << 31), "rope: heads x head_dim / 2 must be below 2^31");
  if (half % 4 == 0 && src_stride % 4 == 0 && dst_stride % 4 == 0 && pack4_aligned<Src>(src) &&
      pack4_aligned<Dst>(dst) && pack4_aligned<float>(t.cos) && pack4_aligned<float>(t.sin)) {
    const int64_t packs = (heads + kRopeHeads - 1) / kRopeHeads * (half / 4);
    const RowsLaunch l = amax_capped(launch_over_rows(rows, packs), amax);
    rope4_kernel<<<l.grid, l.block, 0, stream>>>(src, src_stride, dst, dst_stride, rows, heads, seq, positions_start,
                                                 t.cos, t.sin, half, positions, direction, amax_bits);
  } else {
    const RowsLaunch l = amax_capped(launch_over_rows(rows, heads * half), amax);
    rope_kernel<<<l.grid, l.block, 0, stream>>>(src, src_stride, dst, dst_stride, rows, heads, seq, positions_start,
                                                t.cos, t.sin, half, positions, direction, amax_bits);
  }
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
                           float* amax, cudaStream_t stream) {
  rotate(static_cast<const __nv_bfloat16*>(src16), src_stride, dst, dst_stride, rows, heads, seq, 0, table, positions,
         -1.0f, stream, amax);
}

}  // namespace loom::kernels::cuda
