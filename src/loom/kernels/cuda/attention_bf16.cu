#include <cuda_bf16.h>

#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/attention_operands.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/cudnn_attention.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

// Element (row, col) of a region sits at row * stride + col in the source and in its copy; the
// kernels run row by row (launch_over_rows), with no division per element.
__global__ void to_bf16_kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, int64_t rows,
                               int64_t span, int64_t stride) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < span; c += column_stride())
      dst[r * stride + c] = __float2bfloat16_rn(src[r * stride + c]);
  }
}

__global__ void widen_kernel(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src, int64_t rows,
                             int64_t span, int64_t stride) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < span; c += column_stride())
      dst[r * stride + c] = __bfloat162float(src[r * stride + c]);
  }
}

// dst16's rows (dst_stride apart) = src's (src_stride apart) rounded to bf16; with partial, each
// column's sum of the src values over chunk k's rows into partial[k, c] (column_sums.h's order, which
// add_partial_column_sums finishes). A thread per (column, chunk).
template <typename Src>
__global__ void rows_to_bf16_kernel(__nv_bfloat16* __restrict__ dst16, int64_t dst_stride, const Src* __restrict__ src,
                                    int64_t src_stride, int64_t rows, int64_t width, float* __restrict__ partial,
                                    int64_t chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, k = blockIdx.y;
  if (c >= width) return;
  const int64_t last = min(rows, (k + 1) * chunk);
  float sum = 0.0f;
  for (int64_t r = k * chunk; r < last; ++r) {
    const float v = load(src, r * src_stride + c);
    if (dst16 != nullptr) dst16[r * dst_stride + c] = __float2bfloat16_rn(v);
    sum = __fadd_rn(sum, v);
  }
  if (partial != nullptr) partial[k * width + c] = sum;
}

// Two adjacent elements as one aligned access (4 bytes of bf16, 8 of fp32).
template <typename T>
struct alignas(2 * sizeof(T)) Pair {
  T v[2];
};
template <typename T>
bool pair_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pair<T>) == 0;
}

// rows_to_bf16_kernel two columns per thread (width and both strides even, both pointers
// pair-aligned), a thread's kRows rows loaded before any is stored, so it keeps 64 bytes in flight
// (with sums the threads are few: 98304 for GPT-2's 16384 x 768 gradients). Each column's values
// are still added in row order from zero over chunk k's rows: the same dst16 and partial.
template <typename Src>
constexpr int64_t kRowsInFlight = 32 / sizeof(Src);  // 16 rows of bf16 pairs, 8 of fp32

template <typename Src>
__global__ void rows_to_bf16_pairs_kernel(__nv_bfloat16* __restrict__ dst16, int64_t dst_stride,
                                          const Src* __restrict__ src, int64_t src_stride, int64_t rows,
                                          int64_t width, float* __restrict__ partial, int64_t chunk) {
  constexpr int kRows = static_cast<int>(kRowsInFlight<Src>);
  const int64_t c = 2 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x), k = blockIdx.y;
  if (c >= width) return;
  const auto at = [&](int64_t r) { return *reinterpret_cast<const Pair<Src>*>(src + r * src_stride + c); };
  float sum[2] = {0.0f, 0.0f};
  const auto put = [&](const Pair<Src>& a, int64_t r) {
    Pair<__nv_bfloat16> b;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float v = load(a.v, e);
      b.v[e] = __float2bfloat16_rn(v);
      sum[e] = __fadd_rn(sum[e], v);
    }
    if (dst16 != nullptr) *reinterpret_cast<Pair<__nv_bfloat16>*>(dst16 + r * dst_stride + c) = b;
  };
  const int64_t last = min(rows, (k + 1) * chunk);
  int64_t r = k * chunk;
  for (; r + kRows <= last; r += kRows) {
    Pair<Src> a[kRows];
#pragma unroll
    for (int j = 0; j < kRows; ++j) a[j] = at(r + j);
#pragma unroll
    for (int j = 0; j < kRows; ++j) put(a[j], r + j);
  }
  for (; r < last; ++r) put(at(r), r);
  if (partial == nullptr) return;
  partial[k * width + c] = sum[0];
  partial[k * width + c + 1] = sum[1];
}

// dst's rows += src's widened (kAdd), or = them added to 0, what an add into zeroed rows leaves
// (-0 becomes +0). With `amax` (not null) the max |value| written is taken into it (one atomic per
// block, the grid capped: amax_capped).
template <bool kAdd>
__global__ void add_rows_kernel(float* __restrict__ dst, int64_t dst_stride, const __nv_bfloat16* __restrict__ src,
                                int64_t src_stride, int64_t rows, int64_t width, unsigned* amax) {
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < width; c += column_stride()) {
      const float w = __bfloat162float(src[r * src_stride + c]);
      float& d = dst[r * dst_stride + c];
      d = kAdd ? __fadd_rn(d, w) : __fadd_rn(0.0f, w);
      if (amax != nullptr) m = nan_max(m, fabsf(d));
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

template <bool kAdd>
void launch_add_rows(float* dst, int64_t dst_stride, const __nv_bfloat16* src, int64_t src_stride, int64_t rows,
                     int64_t width, cudaStream_t stream, float* amax = nullptr) {
  if (rows * width == 0) return;
  const RowsLaunch l = amax_capped(launch_over_rows(rows, width), amax);
  add_rows_kernel<kAdd><<<l.grid, l.block, 0, stream>>>(dst, dst_stride, src, src_stride, rows, width,
                                                        reinterpret_cast<unsigned*>(amax));
  check_launch("attention add_rows_kernel");
}

// *amax = max(*amax, max |x|) over rows of `width` floats `stride` apart (amax_into's contract).
__global__ void rows_amax_kernel(const float* __restrict__ x, int64_t stride, int64_t rows, int64_t width,
                                 unsigned* amax) {
  float m = 0.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < width; c += column_stride()) m = nan_max(m, fabsf(x[r * stride + c]));
  }
  block_amax_into(amax, m);
}

void rows_amax(float* amax, const float* x, int64_t stride, int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = amax_capped(launch_over_rows(rows, width), amax);
  rows_amax_kernel<<<l.grid, l.block, 0, stream>>>(x, stride, rows, width, reinterpret_cast<unsigned*>(amax));
  check_launch("attention rows_amax_kernel");
}

// bf16 copies of the views' regions; pointer(i) is view i within its copy.
class Bf16Views {
 public:
  Bf16Views(const std::vector<OperandView>& views, Scratch& scratch, cudaStream_t stream)
      : layout_(share_regions(views)) {
    for (const OperandRegion& r : layout_.regions) {
      copies_.push_back(scratch.of<__nv_bfloat16>(r.elements()));
      if (r.rows * r.span == 0) continue;
      const RowsLaunch l = launch_over_rows(r.rows, r.span);
      to_bf16_kernel<<<l.grid, l.block, 0, stream>>>(copies_.back(), r.base, r.rows, r.span, r.stride);
      check_launch("attention to_bf16_kernel");
    }
  }
  const __nv_bfloat16* pointer(size_t view) const {
    return copies_[static_cast<size_t>(layout_.region_of[view])] + layout_.offset_of[view];
  }

 private:
  OperandLayout layout_;
  std::vector<__nv_bfloat16*> copies_;
};

using Bf16 = __nv_bfloat16;

// The bf16 kernels (cuDNN's where it serves, loom's elsewhere) on bf16 q, k, v, into out16.
void forward_on(Bf16* out16, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, const FlashAttentionShape& s,
                const AttentionVisibility& vis, Scratch& scratch, cudaStream_t stream) {
  if (attention_fallback_reason(s, vis, false, {q, k, v, out16, lse}).empty()) {
    cudnn_attention_forward(out16, lse, q, k, v, s, scratch, stream);
  } else {
    flash_attention_forward(out16, lse, q, k, v, s, vis, stream);
  }
}

// The same for the backward.
void backward_on(float* dq, float* dk, float* dv, const Bf16* dout16, const Bf16* out16, const float* lse,
                 const Bf16* q, const Bf16* k, const Bf16* v, const FlashAttentionShape& s,
                 const AttentionVisibility& vis, Scratch& scratch, cudaStream_t stream) {
  if (attention_fallback_reason(s, vis, true, {q, k, v, out16, dout16, lse}).empty()) {
    cudnn_attention_backward(dq, dk, dv, dout16, out16, lse, q, k, v, s, scratch, stream);
  } else {
    flash_attention_backward(dq, dk, dv, dout16, out16, lse, q, k, v, s, vis, stream);
  }
}

const Bf16* as_bf16(const void* x) { return static_cast<const Bf16*>(x); }

}  // namespace

void flash_attention_forward_bf16(float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis, cudaStream_t stream) {
  Scratch scratch;
  const OperandView o = attention_output_view(s, out);
  __nv_bfloat16* out16 = scratch.of<__nv_bfloat16>(OperandRegion{out, o.rows, o.width, o.stride}.elements());
  const Bf16Views in(attention_views(s, q, k, v), scratch, stream);
  forward_on(out16, lse, in.pointer(0), in.pointer(1), in.pointer(2), s, vis, scratch, stream);
  if (o.rows * o.width == 0) return;
  const RowsLaunch l = launch_over_rows(o.rows, o.width);
  widen_kernel<<<l.grid, l.block, 0, stream>>>(out, out16, o.rows, o.width, o.stride);
  check_launch("attention widen_kernel");
}

void flash_attention_forward_bf16_tensors(void* out16, float* lse, const void* q16, const void* k16, const void* v16,
                                          const FlashAttentionShape& s, const AttentionVisibility& vis,
                                          cudaStream_t stream) {
  Scratch scratch;
  forward_on(static_cast<Bf16*>(out16), lse, as_bf16(q16), as_bf16(k16), as_bf16(v16), s, vis, scratch, stream);
}

void flash_attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis,
                                   cudaStream_t stream) {
  Scratch scratch;
  std::vector<OperandView> views = attention_views(s, q, k, v);
  views.push_back(attention_output_view(s, out));
  views.push_back(attention_output_view(s, dout));
  const Bf16Views in(views, scratch, stream);
  backward_on(dq, dk, dv, in.pointer(4), in.pointer(3), lse, in.pointer(0), in.pointer(1), in.pointer(2), s, vis,
              scratch, stream);
}

void flash_attention_backward_bf16_tensors(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                           const float* lse, const void* q16, const void* k16, const void* v16,
                                           const FlashAttentionShape& s, const AttentionVisibility& vis,
                                           cudaStream_t stream) {
  Scratch scratch;
  backward_on(dq, dk, dv, as_bf16(dout16), as_bf16(out16), lse, as_bf16(q16), as_bf16(k16), as_bf16(v16), s, vis,
              scratch, stream);
}

namespace {
// One gradient's rows [rows, width] from src (src_stride apart) into its bf16 view (dst_stride
// apart; null: the sums alone), with the column sums into dbias when there is one (rows_to_bf16_kernel).
template <typename Src>
void gradient_to_bf16(void* dst16, int64_t dst_stride, float* dbias, const Src* src, int64_t src_stride, int64_t rows,
                      int64_t width, Scratch& scratch, cudaStream_t stream) {
  if (rows * width == 0) return;
  const ColumnChunks l = column_chunks(rows, width, "cuda::flash_attention_backward_bf16_gradients");
  float* partial = dbias != nullptr ? scratch.floats(l.chunks * width) : nullptr;
  if (width % 2 == 0 && src_stride % 2 == 0 && dst_stride % 2 == 0 && pair_aligned<Src>(src) &&
      pair_aligned<Bf16>(dst16)) {
    // A thread per (two columns, chunk); with no sums the rows split freely: chunks of
    // kRowsInFlight rows (a multiple of it past 65535 chunks), one step of the kernel each.
    constexpr int64_t kRows = kRowsInFlight<Src>;
    const int64_t chunk = dbias != nullptr ? l.chunk : kRows * ((rows + kRows * 65535 - 1) / (kRows * 65535));
    const int64_t pairs = width / 2, threads = std::min<int64_t>(kThreads, (pairs + 31) / 32 * 32);
    const dim3 grid(static_cast<unsigned>((pairs + threads - 1) / threads),
                    static_cast<unsigned>((rows + chunk - 1) / chunk));
    rows_to_bf16_pairs_kernel<Src><<<grid, static_cast<unsigned>(threads), 0, stream>>>(
        static_cast<Bf16*>(dst16), dst_stride, src, src_stride, rows, width, partial, chunk);
  } else {
    rows_to_bf16_kernel<Src><<<l.grid, kThreads, 0, stream>>>(static_cast<Bf16*>(dst16), dst_stride, src, src_stride,
                                                              rows, width, partial, l.chunk);
  }
  check_launch("attention rows_to_bf16_kernel");
  if (dbias != nullptr) add_partial_column_sums(dbias, partial, l.chunks, width, stream);
}

// A backward's q, k, v, out and dout as bf16 tensors, and where cuDNN serves it, its gradients as
// cuDNN leaves them: bf16, rows packed (dq [q rows, heads x head_dim], dk and dv [k rows, kv_heads
// x head_dim]); null where loom's kernels serve the call.
struct CudnnGradients {
  const Bf16 *q, *k, *v, *out, *dout;
  Bf16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
};
// Where cuDNN serves the backward and a plan writing its gradients at the views' strides builds:
// cuDNN's bf16 gradients written straight into the views dq16, dk16, dv16 (no packed copy to move
// into them); false, nothing done, otherwise.
bool cudnn_gradients_into_views(void* dq16, void* dk16, void* dv16, const void* dout16, const void* out16,
                                const float* lse, const void* q16, const void* k16, const void* v16,
                                const FlashAttentionShape& s, const AttentionVisibility& vis, Scratch& scratch,
                                cudaStream_t stream) {
  const CudnnGradientStrides views{s.q_stride, s.k_stride, s.v_stride};
  if (!attention_fallback_reason(s, vis, true, {q16, k16, v16, out16, dout16, lse}).empty()) return false;
  if (!cudnn_gradient_views_refusal(s, dq16, dk16, dv16).empty()) return false;
  cudnn_attention_backward_bf16(static_cast<Bf16*>(dq16), static_cast<Bf16*>(dk16), static_cast<Bf16*>(dv16),
                                as_bf16(dout16), as_bf16(out16), lse, as_bf16(q16), as_bf16(k16), as_bf16(v16), s,
                                scratch, stream, views);
  return true;
}

// RoPE undone on the q and k gradients' bf16 views, in place (nothing without a rotation).
void rotate_gradients_back(void* dq16, void* dk16, const FlashAttentionShape& s, const DeviceQkvRotation& rotation,
                           cudaStream_t stream) {
  if (rotation.table == nullptr) return;
  const DeviceRopeTable& t = *rotation.table;
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  rope_backward_bf16(dq16, q_rows, s.q_stride, 0, s.heads, rotation.seq, 0, t, rotation.positions, stream);
  rope_backward_bf16(dk16, k_rows, s.k_stride, 0, s.kv_heads, rotation.seq, 0, t, rotation.positions, stream);
}

CudnnGradients cudnn_gradients(const void* dout16, const void* out16, const float* lse, const void* q16,
                               const void* k16, const void* v16, const FlashAttentionShape& s,
                               const AttentionVisibility& vis, Scratch& scratch, cudaStream_t stream) {
  CudnnGradients g{as_bf16(q16), as_bf16(k16), as_bf16(v16), as_bf16(out16), as_bf16(dout16)};
  if (!attention_fallback_reason(s, vis, true, {g.q, g.k, g.v, g.out, g.dout, lse}).empty()) return g;
  const int64_t kv_elements = s.batch * s.k_len * s.kv_heads * s.head_dim;
  g.dq = scratch.of<Bf16>(s.batch * s.q_len * s.heads * s.head_dim);
  g.dk = scratch.of<Bf16>(kv_elements);
  g.dv = scratch.of<Bf16>(kv_elements);
  cudnn_attention_backward_bf16(g.dq, g.dk, g.dv, g.dout, g.out, lse, g.q, g.k, g.v, s, scratch, stream);
  return g;
}
}  // namespace

void flash_attention_backward_bf16_gradients(void* dq16, void* dk16, void* dv16, float* dbias_q, float* dbias_k,
                                             float* dbias_v, const void* dout16, const void* out16, const float* lse,
                                             const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const DeviceQkvRotation& rotation, cudaStream_t stream) {
  // The cuDNN path below sums the q/k bias gradients before it rotates (ops.cpp refuses the pair).
  LOOM_CHECK(rotation.table == nullptr || (dbias_q == nullptr && dbias_k == nullptr),
             "flash_attention_backward_bf16_gradients: q/k bias gradients with RoPE are not supported");
  Scratch scratch;
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  if (cudnn_gradients_into_views(dq16, dk16, dv16, dout16, out16, lse, q16, k16, v16, s, vis, scratch, stream)) {
    // cuDNN's bf16 gradients in the views already: the bias gradients their column sums, q's and
    // k's rotated back in place (the same bits as copying them in first).
    const auto* dq = static_cast<const Bf16*>(dq16);
    const auto* dk = static_cast<const Bf16*>(dk16);
    const auto* dv = static_cast<const Bf16*>(dv16);
    if (dbias_q != nullptr) gradient_to_bf16(nullptr, 0, dbias_q, dq, s.q_stride, q_rows, q_width, scratch, stream);
    if (dbias_k != nullptr) gradient_to_bf16(nullptr, 0, dbias_k, dk, s.k_stride, k_rows, kv_width, scratch, stream);
    if (dbias_v != nullptr) gradient_to_bf16(nullptr, 0, dbias_v, dv, s.v_stride, k_rows, kv_width, scratch, stream);
    rotate_gradients_back(dq16, dk16, s, rotation, stream);
    return;
  }
  const CudnnGradients g = cudnn_gradients(dout16, out16, lse, q16, k16, v16, s, vis, scratch, stream);
  if (g.dq != nullptr) {
    // cuDNN's bf16 gradients, packed, copied into the views, then rotated back there: the bits the
    // fp32 path widens, rotates and casts back.
    gradient_to_bf16(dq16, s.q_stride, dbias_q, g.dq, q_width, q_rows, q_width, scratch, stream);
    gradient_to_bf16(dk16, s.k_stride, dbias_k, g.dk, kv_width, k_rows, kv_width, scratch, stream);
    gradient_to_bf16(dv16, s.v_stride, dbias_v, g.dv, kv_width, k_rows, kv_width, scratch, stream);
    rotate_gradients_back(dq16, dk16, s, rotation, stream);
    return;
  }
  // loom's kernels add fp32 gradients in q's, k's and v's layout: into zeroed copies, rotated back
  // there, then rounded.
  auto zeroed_copy = [&](int64_t rows, int64_t width, int64_t stride) {
    const int64_t n = rows == 0 ? 0 : (rows - 1) * stride + width;
    float* x = scratch.floats(n);
    check_cuda(cudaMemsetAsync(x, 0, static_cast<size_t>(n) * sizeof(float), stream), "cudaMemsetAsync (gradients)");
    return x;
  };
  float* dq = zeroed_copy(q_rows, q_width, s.q_stride);
  float* dk = zeroed_copy(k_rows, kv_width, s.k_stride);
  float* dv = zeroed_copy(k_rows, kv_width, s.v_stride);
  flash_attention_backward(dq, dk, dv, g.dout, g.out, lse, g.q, g.k, g.v, s, vis, stream);
  if (rotation.table != nullptr) {
    const DeviceRopeTable& t = *rotation.table;
    rope_backward(dq, q_rows, s.q_stride, 0, s.heads, rotation.seq, 0, t, rotation.positions, stream);
    rope_backward(dk, k_rows, s.k_stride, 0, s.kv_heads, rotation.seq, 0, t, rotation.positions, stream);
  }
  gradient_to_bf16(dq16, s.q_stride, dbias_q, dq, s.q_stride, q_rows, q_width, scratch, stream);
  gradient_to_bf16(dk16, s.k_stride, dbias_k, dk, s.k_stride, k_rows, kv_width, scratch, stream);
  gradient_to_bf16(dv16, s.v_stride, dbias_v, dv, s.v_stride, k_rows, kv_width, scratch, stream);
}

void flash_attention_backward_fp32_gradients(float* dq, float* dk, float* dv, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const DeviceQkvRotation& rotation, float* amax, cudaStream_t stream) {
  Scratch scratch;
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  const CudnnGradients g = cudnn_gradients(dout16, out16, lse, q16, k16, v16, s, vis, scratch, stream);
  if (g.dq != nullptr) {
    // cuDNN's bf16 gradients, packed, widened into the views, q's and k's rotated back in the same
    // pass: the bits of adding them into zeroed views and rotating there. The amax from the same
    // passes.
    if (rotation.table != nullptr) {
      const DeviceRopeTable& t = *rotation.table;
      rope_backward_widened(dq, s.q_stride, g.dq, q_width, q_rows, s.heads, rotation.seq, t, rotation.positions, amax,
                            stream);
      rope_backward_widened(dk, s.k_stride, g.dk, kv_width, k_rows, s.kv_heads, rotation.seq, t, rotation.positions,
                            amax, stream);
    } else {
      launch_add_rows<false>(dq, s.q_stride, g.dq, q_width, q_rows, q_width, stream, amax);
      launch_add_rows<false>(dk, s.k_stride, g.dk, kv_width, k_rows, kv_width, stream, amax);
    }
    launch_add_rows<false>(dv, s.v_stride, g.dv, kv_width, k_rows, kv_width, stream, amax);
    return;
  }
  // loom's kernels add fp32 gradients: into the views zeroed, rotated back there.
  auto zero_view = [&](float* x, int64_t rows, int64_t width, int64_t stride) {
    if (rows * width == 0) return;
    check_cuda(cudaMemset2DAsync(x, static_cast<size_t>(stride) * sizeof(float), 0,
                                 static_cast<size_t>(width) * sizeof(float), static_cast<size_t>(rows), stream),
               "cudaMemset2DAsync (attention gradients)");
  };
  zero_view(dq, q_rows, q_width, s.q_stride);
  zero_view(dk, k_rows, kv_width, s.k_stride);
  zero_view(dv, k_rows, kv_width, s.v_stride);
  flash_attention_backward(dq, dk, dv, g.dout, g.out, lse, g.q, g.k, g.v, s, vis, stream);
  if (rotation.table != nullptr) {
    const DeviceRopeTable& t = *rotation.table;
    rope_backward(dq, q_rows, s.q_stride, 0, s.heads, rotation.seq, 0, t, rotation.positions, stream);
    rope_backward(dk, k_rows, s.k_stride, 0, s.kv_heads, rotation.seq, 0, t, rotation.positions, stream);
  }
  if (amax == nullptr) return;
  rows_amax(amax, dq, s.q_stride, q_rows, q_width, stream);
  rows_amax(amax, dk, s.k_stride, k_rows, kv_width, stream);
  rows_amax(amax, dv, s.v_stride, k_rows, kv_width, stream);
}

void add_bf16_rows(float* dst, int64_t dst_stride, const __nv_bfloat16* src, int64_t src_stride, int64_t rows,
                   int64_t width, cudaStream_t stream) {
  launch_add_rows<true>(dst, dst_stride, src, src_stride, rows, width, stream);
}

}  // namespace loom::kernels::cuda
