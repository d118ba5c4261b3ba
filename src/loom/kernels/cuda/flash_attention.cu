#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tokens.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/flash_attention_tc.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/shared_memory.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int kKeys = 32;       // keys per tile (one per lane)
constexpr int kQueryRows = 16;  // queries per block (one per warp)
constexpr int kTileThreads = kQueryRows * 32;
constexpr int kMaxDim = 256;
constexpr int kPerLane = kMaxDim / 32;  // feature columns a lane accumulates
constexpr float kNegInf = -INFINITY;

__device__ inline float load(const float* p) { return *p; }
__device__ inline float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ inline void store(float* p, float value) { *p = value; }
__device__ inline void store(__nv_bfloat16* p, float value) { *p = __float2bfloat16(value); }

__device__ float dot(const float* a, const float* b, int n) {
  float sum = 0.0f;
  for (int d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// acc[t] (column lane + 32 t) += weight * row[column].
__device__ inline void add_row(float (&acc)[kPerLane], float weight, const float* row, int lane, int dim) {
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < dim) acc[t] += weight * row[d];
  }
}

template <typename T>
__global__ void __launch_bounds__(kTileThreads) forward_kernel(T* out, float* lse, const T* q, const T* k, const T* v,
                                                               FlashAttentionShape s, Tokens qt, Tokens kt) {
  extern __shared__ float smem[];
  __shared__ int32_t qpos[kQueryRows], qdoc[kQueryRows], kpos[kKeys], kdoc[kKeys];
  const int dim = static_cast<int>(s.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ks = smem;                   // [kKeys][dim + 1]: lane j reads row j
  float* vs = ks + kKeys * (dim + 1);  // [kKeys][dim]: lane reads column lane + 32 t
  float* qs = vs + kKeys * dim;        // [kQueryRows][dim]
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kQueryRows;
  const int64_t kvh = h / (s.heads / s.kv_heads), i = i0 + warp;
  const bool active = i < s.q_len;
  const int nq = static_cast<int>(min(static_cast<int64_t>(kQueryRows), s.q_len - i0));
  for (int d = lane; d < dim; d += 32) qs[warp * dim + d] = active ? load(q + (b * s.q_len + i) * s.q_stride + h * dim + d) : 0.0f;
  if (lane == 0 && active) {
    qpos[warp] = qt.position(b, i);
    qdoc[warp] = qt.document(b, i);
  }
  __syncthreads();
  const Range qr = range_of(qpos, qdoc, nq);
  const int32_t my_pos = active ? qpos[warp] : 0, my_doc = active ? qdoc[warp] : 0;
  const float scale = 1.0f / sqrtf(static_cast<float>(dim));
  float m = kNegInf, l = 0.0f, acc[kPerLane] = {};
  for (int64_t j0 = 0; j0 < s.k_len; j0 += kKeys) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(kKeys), s.k_len - j0));
    __syncthreads();  // the previous tile's readers are done
    if (threadIdx.x < nk) {
      kpos[threadIdx.x] = kt.position(b, j0 + threadIdx.x);
      kdoc[threadIdx.x] = kt.document(b, j0 + threadIdx.x);
    }
    __syncthreads();
    if (hidden(qr, range_of(kpos, kdoc, nk))) continue;  // the same answer in every thread
    for (int idx = threadIdx.x; idx < nk * dim; idx += blockDim.x) {
      const int j = idx / dim, d = idx % dim;
      const int64_t row = b * s.k_len + j0 + j;
      ks[j * (dim + 1) + d] = load(k + row * s.k_stride + kvh * dim + d);
      vs[j * dim + d] = load(v + row * s.v_stride + kvh * dim + d);
    }
    __syncthreads();
    if (!active) continue;
    float score = kNegInf;
    if (lane < nk && kdoc[lane] == my_doc && kpos[lane] <= my_pos)
      score = dot(qs + warp * dim, ks + lane * (dim + 1), dim) * scale;
    const float m_new = fmaxf(m, warp_max(score));
    if (m_new == kNegInf) continue;  // nothing visible to this query yet
    const float correction = m == kNegInf ? 0.0f : expf(m - m_new);
    const float p = score == kNegInf ? 0.0f : expf(score - m_new);
    l = l * correction + warp_sum(p);
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) acc[t] *= correction;
    for (int j = 0; j < nk; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      if (pj != 0.0f) add_row(acc, pj, vs + j * dim, lane, dim);
    }
    m = m_new;
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < dim) store(out + (b * s.q_len + i) * s.out_stride + h * dim + d, l > 0.0f ? acc[t] / l : 0.0f);
  }
  if (lane == 0) lse[(b * s.heads + h) * s.q_len + i] = l > 0.0f ? m + logf(l) : kNegInf;
}

// delta[b, h, i] = dout . out over the head's features (one warp per row).
template <typename T>
__global__ void delta_kernel(float* delta, const T* dout, const T* out, FlashAttentionShape s) {
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (row >= s.batch * s.q_len * s.heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t h = row % s.heads, i = (row / s.heads) % s.q_len, b = row / (s.heads * s.q_len);
  const int64_t at = (b * s.q_len + i) * s.out_stride + h * s.head_dim;
  float sum = 0.0f;
  for (int64_t d = lane; d < s.head_dim; d += 32) sum += load(out + at + d) * load(dout + at + d);
  sum = warp_sum(sum);
  if (lane == 0) delta[(b * s.heads + h) * s.q_len + i] = sum;
}

// dq of a block of queries (one warp each): sum over visible keys of dS_ij k_j.
template <typename T>
__global__ void __launch_bounds__(kTileThreads) backward_queries_kernel(float* dq, const T* dout, const float* lse,
                                                                        const float* delta, const T* q, const T* k,
                                                                        const T* v, FlashAttentionShape s, Tokens qt,
                                                                        Tokens kt) {
  extern __shared__ float smem[];
  __shared__ int32_t qpos[kQueryRows], qdoc[kQueryRows], kpos[kKeys], kdoc[kKeys];
  const int dim = static_cast<int>(s.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* ks = smem;                    // [kKeys][dim + 1]
  float* vs = ks + kKeys * (dim + 1);  // [kKeys][dim + 1]
  float* qs = vs + kKeys * (dim + 1);  // [kQueryRows][dim]
  float* gs = qs + kQueryRows * dim;   // [kQueryRows][dim]: dout
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kQueryRows;
  const int64_t kvh = h / (s.heads / s.kv_heads), i = i0 + warp;
  const bool active = i < s.q_len;
  const int nq = static_cast<int>(min(static_cast<int64_t>(kQueryRows), s.q_len - i0));
  for (int d = lane; d < dim; d += 32) {
    qs[warp * dim + d] = active ? load(q + (b * s.q_len + i) * s.q_stride + h * dim + d) : 0.0f;
    gs[warp * dim + d] = active ? load(dout + (b * s.q_len + i) * s.out_stride + h * dim + d) : 0.0f;
  }
  if (lane == 0 && active) {
    qpos[warp] = qt.position(b, i);
    qdoc[warp] = qt.document(b, i);
  }
  __syncthreads();
  const Range qr = range_of(qpos, qdoc, nq);
  const int32_t my_pos = active ? qpos[warp] : 0, my_doc = active ? qdoc[warp] : 0;
  const int64_t stat = (b * s.heads + h) * s.q_len + i;
  const float my_lse = active ? lse[stat] : kNegInf, my_delta = active ? delta[stat] : 0.0f;
  const float scale = 1.0f / sqrtf(static_cast<float>(dim));
  float acc[kPerLane] = {};
  for (int64_t j0 = 0; j0 < s.k_len; j0 += kKeys) {
    const int nk = static_cast<int>(min(static_cast<int64_t>(kKeys), s.k_len - j0));
    __syncthreads();
    if (threadIdx.x < nk) {
      kpos[threadIdx.x] = kt.position(b, j0 + threadIdx.x);
      kdoc[threadIdx.x] = kt.document(b, j0 + threadIdx.x);
    }
    __syncthreads();
    if (hidden(qr, range_of(kpos, kdoc, nk))) continue;
    for (int idx = threadIdx.x; idx < nk * dim; idx += blockDim.x) {
      const int j = idx / dim, d = idx % dim;
      const int64_t row = b * s.k_len + j0 + j;
      ks[j * (dim + 1) + d] = load(k + row * s.k_stride + kvh * dim + d);
      vs[j * (dim + 1) + d] = load(v + row * s.v_stride + kvh * dim + d);
    }
    __syncthreads();
    if (!active || my_lse == kNegInf) continue;
    float ds = 0.0f;
    if (lane < nk && kdoc[lane] == my_doc && kpos[lane] <= my_pos) {
      const float p = expf(dot(qs + warp * dim, ks + lane * (dim + 1), dim) * scale - my_lse);
      const float dp = dot(gs + warp * dim, vs + lane * (dim + 1), dim);
      ds = p * (dp - my_delta) * scale;
    }
    for (int j = 0; j < nk; ++j) {
      const float dsj = __shfl_sync(0xffffffffu, ds, j);
      if (dsj != 0.0f) add_row(acc, dsj, ks + j * (dim + 1), lane, dim);
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d < dim) dq[(b * s.q_len + i) * s.q_stride + h * dim + d] += acc[t];
  }
}

constexpr int kKeyRows = 16;  // keys per block of the dk/dv pass (one warp each)
constexpr int kQueries = 32;  // queries per tile of that pass (one per lane)

// dk, dv of a block of keys of kv head kvh: sums over its query heads and visible queries of
// dS_ij q_i and P_ij dout_i.
template <typename T>
__global__ void __launch_bounds__(kKeyRows * 32) backward_keys_kernel(float* dk, float* dv, const T* dout,
                                                                     const float* lse, const float* delta, const T* q,
                                                                     const T* k, const T* v, FlashAttentionShape s,
                                                                     Tokens qt, Tokens kt) {
  extern __shared__ float smem[];
  __shared__ int32_t qpos[kQueries], qdoc[kQueries], kpos[kKeyRows], kdoc[kKeyRows];
  __shared__ float lse_s[kQueries], delta_s[kQueries];
  const int dim = static_cast<int>(s.head_dim), lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* qs = smem;                       // [kQueries][dim + 1]
  float* gs = qs + kQueries * (dim + 1);  // [kQueries][dim + 1]: dout
  float* kr = gs + kQueries * (dim + 1);  // [kKeyRows][dim]
  float* vr = kr + kKeyRows * dim;        // [kKeyRows][dim]
  const int64_t b = blockIdx.z, kvh = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * kKeyRows;
  const int64_t j = j0 + warp, group = s.heads / s.kv_heads;
  const bool active = j < s.k_len;
  const int nk = static_cast<int>(min(static_cast<int64_t>(kKeyRows), s.k_len - j0));
  for (int d = lane; d < dim; d += 32) {
    kr[warp * dim + d] = active ? load(k + (b * s.k_len + j) * s.k_stride + kvh * dim + d) : 0.0f;
    vr[warp * dim + d] = active ? load(v + (b * s.k_len + j) * s.v_stride + kvh * dim + d) : 0.0f;
  }
  if (lane == 0 && active) {
    kpos[warp] = kt.position(b, j);
    kdoc[warp] = kt.document(b, j);
  }
  __syncthreads();
  const Range krange = range_of(kpos, kdoc, nk);
  const int32_t my_pos = active ? kpos[warp] : 0, my_doc = active ? kdoc[warp] : 0;
  const float scale = 1.0f / sqrtf(static_cast<float>(dim));
  float dk_acc[kPerLane] = {}, dv_acc[kPerLane] = {};
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < s.q_len; i0 += kQueries) {
      const int nq = static_cast<int>(min(static_cast<int64_t>(kQueries), s.q_len - i0));
      __syncthreads();
      if (threadIdx.x < nq) {
        const int64_t stat = (b * s.heads + h) * s.q_len + i0 + threadIdx.x;
        qpos[threadIdx.x] = qt.position(b, i0 + threadIdx.x);
        qdoc[threadIdx.x] = qt.document(b, i0 + threadIdx.x);
        lse_s[threadIdx.x] = lse[stat];
        delta_s[threadIdx.x] = delta[stat];
      }
      __syncthreads();
      if (hidden(range_of(qpos, qdoc, nq), krange)) continue;
      for (int idx = threadIdx.x; idx < nq * dim; idx += blockDim.x) {
        const int r = idx / dim, d = idx % dim;
        const int64_t row = b * s.q_len + i0 + r;
        qs[r * (dim + 1) + d] = load(q + row * s.q_stride + h * dim + d);
        gs[r * (dim + 1) + d] = load(dout + row * s.out_stride + h * dim + d);
      }
      __syncthreads();
      if (!active) continue;
      float p = 0.0f, ds = 0.0f;
      if (lane < nq && qdoc[lane] == my_doc && my_pos <= qpos[lane] && lse_s[lane] != kNegInf) {
        p = expf(dot(qs + lane * (dim + 1), kr + warp * dim, dim) * scale - lse_s[lane]);
        const float dp = dot(gs + lane * (dim + 1), vr + warp * dim, dim);
        ds = p * (dp - delta_s[lane]) * scale;
      }
      for (int r = 0; r < nq; ++r) {
        const float pr = __shfl_sync(0xffffffffu, p, r), dsr = __shfl_sync(0xffffffffu, ds, r);
        if (pr != 0.0f) add_row(dv_acc, pr, gs + r * (dim + 1), lane, dim);
        if (dsr != 0.0f) add_row(dk_acc, dsr, qs + r * (dim + 1), lane, dim);
      }
    }
  }
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kPerLane; ++t) {
    const int d = lane + 32 * t;
    if (d >= dim) continue;
    dk[(b * s.k_len + j) * s.k_stride + kvh * dim + d] += dk_acc[t];
    dv[(b * s.k_len + j) * s.v_stride + kvh * dim + d] += dv_acc[t];
  }
}

__global__ void merge_kernel(float* out, float* lse, const float* part_out, const float* part_lse,
                             FlashAttentionShape s) {
  for (int64_t k = grid_start(); k < s.batch * s.q_len * s.heads; k += grid_stride()) {
    const int64_t h = k % s.heads, i = (k / s.heads) % s.q_len, b = k / (s.heads * s.q_len);
    const int64_t row = (b * s.heads + h) * s.q_len + i;
    const float l1 = lse[row], l2 = part_lse[row], hi = fmaxf(l1, l2);
    if (hi == kNegInf) continue;
    const float w1 = l1 == kNegInf ? 0.0f : expf(l1 - hi), w2 = l2 == kNegInf ? 0.0f : expf(l2 - hi);
    const float total = w1 + w2;
    float* o = out + (b * s.q_len + i) * s.out_stride + h * s.head_dim;
    const float* po = part_out + (b * s.q_len + i) * s.out_stride + h * s.head_dim;
    for (int64_t d = 0; d < s.head_dim; ++d) o[d] = (o[d] * w1 + po[d] * w2) / total;
    lse[row] = hi + logf(total);
  }
}

void check_shape(const FlashAttentionShape& s) {
  LOOM_CHECK(s.head_dim >= 1 && s.head_dim <= kMaxDim,
             "flash attention on the GPU: head_dim " + std::to_string(s.head_dim) + " is outside [1, " +
                 std::to_string(kMaxDim) + "]");
  LOOM_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
             "flash attention: kv_heads " + std::to_string(s.kv_heads) + " must divide heads " +
                 std::to_string(s.heads));
  LOOM_CHECK(s.batch <= 65535 && s.heads <= 65535, "flash attention on the GPU: batch " + std::to_string(s.batch) +
                                                       " and heads " + std::to_string(s.heads) +
                                                       " must each be at most 65535");
}

unsigned blocks_of(int64_t n, int64_t block) { return static_cast<unsigned>((n + block - 1) / block); }

template <typename T>
void forward(T* out, float* lse, const T* q, const T* k, const T* v, const FlashAttentionShape& s,
             const AttentionVisibility& vis, cudaStream_t stream) {
  check_shape(s);
  if (s.batch * s.heads * s.q_len == 0) return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (tensor_core_attention_supports(s, {out, q, k, v})) {
      tensor_core_attention_forward(out, lse, q, k, v, s, vis, stream);
      return;
    }
  }
  const size_t bytes = sizeof(float) * (kKeys * (s.head_dim + 1) + kKeys * s.head_dim + kQueryRows * s.head_dim);
  allow_shared(forward_kernel<T>, bytes, "forward_kernel");
  const dim3 grid(blocks_of(s.q_len, kQueryRows), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  forward_kernel<T><<<grid, kTileThreads, bytes, stream>>>(out, lse, q, k, v, s, Tokens{vis.q_pos, vis.q_doc, s.q_len},
                                                           Tokens{vis.k_pos, vis.k_doc, s.k_len});
  check_launch("flash_attention forward_kernel");
}

template <typename T>
void backward(float* dq, float* dk, float* dv, const T* dout, const T* out, const float* lse, const T* q, const T* k,
              const T* v, const FlashAttentionShape& s, const AttentionVisibility& vis, cudaStream_t stream) {
  check_shape(s);
  const int64_t rows = s.batch * s.heads * s.q_len;
  if (rows == 0 || s.k_len == 0) return;
  const Tokens qt{vis.q_pos, vis.q_doc, s.q_len}, kt{vis.k_pos, vis.k_doc, s.k_len};
  float* delta = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&delta), rows * sizeof(float), stream), "cudaMallocAsync");
  delta_kernel<T><<<blocks_of(rows * 32, kThreads), kThreads, 0, stream>>>(delta, dout, out, s);
  check_launch("flash_attention delta_kernel");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (tensor_core_attention_supports(s, {dout, out, q, k, v})) {
      tensor_core_attention_backward(dq, dk, dv, dout, lse, delta, q, k, v, s, vis, stream);
      check_cuda(cudaFreeAsync(delta, stream), "cudaFreeAsync");
      return;
    }
  }
  const size_t q_bytes = sizeof(float) * (2 * kKeys * (s.head_dim + 1) + 2 * kQueryRows * s.head_dim);
  allow_shared(backward_queries_kernel<T>, q_bytes, "backward_queries_kernel");
  const dim3 q_grid(blocks_of(s.q_len, kQueryRows), static_cast<unsigned>(s.heads), static_cast<unsigned>(s.batch));
  backward_queries_kernel<T><<<q_grid, kTileThreads, q_bytes, stream>>>(dq, dout, lse, delta, q, k, v, s, qt, kt);
  check_launch("flash_attention backward_queries_kernel");
  const size_t k_bytes = sizeof(float) * (2 * kQueries * (s.head_dim + 1) + 2 * kKeyRows * s.head_dim);
  allow_shared(backward_keys_kernel<T>, k_bytes, "backward_keys_kernel");
  const dim3 k_grid(blocks_of(s.k_len, kKeyRows), static_cast<unsigned>(s.kv_heads), static_cast<unsigned>(s.batch));
  backward_keys_kernel<T><<<k_grid, kKeyRows * 32, k_bytes, stream>>>(dk, dv, dout, lse, delta, q, k, v, s, qt, kt);
  check_launch("flash_attention backward_keys_kernel");
  check_cuda(cudaFreeAsync(delta, stream), "cudaFreeAsync");
}

}  // namespace

void flash_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionShape& s, const AttentionVisibility& vis, cudaStream_t stream) {
  forward(out, lse, q, k, v, s, vis, stream);
}
void flash_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const FlashAttentionShape& s, const AttentionVisibility& vis,
                             cudaStream_t stream) {
  forward(out, lse, q, k, v, s, vis, stream);
}
void flash_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out, const float* lse,
                              const float* q, const float* k, const float* v, const FlashAttentionShape& s,
                              const AttentionVisibility& vis, cudaStream_t stream) {
  backward(dq, dk, dv, dout, out, lse, q, k, v, s, vis, stream);
}
void flash_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, const FlashAttentionShape& s, const AttentionVisibility& vis,
                              cudaStream_t stream) {
  backward(dq, dk, dv, dout, out, lse, q, k, v, s, vis, stream);
}

void merge_attention_partials(float* out, float* lse, const float* part_out, const float* part_lse,
                              const FlashAttentionShape& s, cudaStream_t stream) {
  const int64_t rows = s.batch * s.q_len * s.heads;
  if (rows == 0) return;
  merge_kernel<<<grid_for(rows), kThreads, 0, stream>>>(out, lse, part_out, part_lse, s);
  check_launch("merge_kernel");
}

}  // namespace loom::kernels::cuda
