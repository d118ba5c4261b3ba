#include <cuda_bf16.h>

#include <cmath>
#include <limits>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kPagedThreads = 128;
constexpr int kPagedWarps = kPagedThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;  // a lane's output columns: d = lane + 32 j

// A pool element as fp32 (bf16 widens exactly), and an fp32 value as one (bf16: nearest even).
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ inline T narrow(float x);
template <>
__device__ inline float narrow<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The element offset of position t's row in a pool, through the sequence's block table (none: one
// contiguous cache, attention_decode's).
__device__ inline int64_t cache_row(const int32_t* table, int64_t t, const PagedAttentionShape& s) {
  const int64_t slot = table ? static_cast<int64_t>(table[t / s.block_size]) * s.block_size + t % s.block_size : t;
  return slot * (s.kv_heads * s.head_dim);
}

// Block (row, head), one pass over the keys: each warp takes every kPagedWarps-th key, its lanes
// across head_dim (a key's and a value's row read whole, coalesced), and keeps an online softmax
// (running max, sum and weighted values, rescaled when the max grows); the warps' partial results
// are then merged. Shared memory: q, each warp's max and sum, each warp's weighted values.
template <typename T>
__global__ void __launch_bounds__(kPagedThreads)
    paged_attention_kernel(float* __restrict__ out, const float* __restrict__ q, int64_t q_stride,
                           const T* __restrict__ k_pool, const T* __restrict__ v_pool,
                           const int32_t* __restrict__ block_tables, const int32_t* __restrict__ sequences,
                           const int32_t* __restrict__ positions, int64_t past, PagedAttentionShape s) {
  extern __shared__ float shared[];
  const int64_t hd = s.head_dim;
  float* qs = shared;                       // [hd]
  float* stats = qs + hd;                   // [warps][max, sum]
  float* partial = stats + 2 * kPagedWarps;  // [warps][hd]
  const int64_t r = blockIdx.x / s.heads, h = blockIdx.x % s.heads;
  // Paged rows carry their sequence and position; without tables, row r is position past + r.
  const int32_t* table = block_tables ? block_tables + static_cast<int64_t>(sequences[r]) * s.table_width : nullptr;
  const int64_t len = (block_tables ? static_cast<int64_t>(positions[r]) : past + r) + 1;
  const int64_t kv_off = (h / (s.heads / s.kv_heads)) * hd;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  for (int64_t d = threadIdx.x; d < hd; d += kPagedThreads) qs[d] = q[r * q_stride + h * hd + d];
  __syncthreads();
  float max_score = -INFINITY, sum = 0.0f, acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc[j] = 0.0f;
  for (int64_t t = warp; t < len; t += kPagedWarps) {
    const int64_t row = cache_row(table, t, s) + kv_off;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) dot = fmaf(qs[d], widen(k_pool[row + d]), dot);
    }
    const float score = warp_sum(dot) * scale;  // every lane
    const float grown = fmaxf(max_score, score);
    const float keep = expf(max_score - grown), weight = expf(score - grown);  // keep: 0 at the first key
    sum = sum * keep + weight;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) acc[j] = fmaf(weight, widen(v_pool[row + d]), acc[j] * keep);
    }
    max_score = grown;
  }
  if (lane == 0) {
    stats[2 * warp] = max_score;
    stats[2 * warp + 1] = sum;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t d = lane + 32 * j;
    if (d < hd) partial[warp * hd + d] = acc[j];
  }
  __syncthreads();
  // A warp without keys (len < kPagedWarps) has max -inf and sum 0: its factor below is 0.
  float top = -INFINITY;
  for (int w = 0; w < kPagedWarps; ++w) top = fmaxf(top, stats[2 * w]);
  float total = 0.0f, factor[kPagedWarps];
  for (int w = 0; w < kPagedWarps; ++w) {
    factor[w] = expf(stats[2 * w] - top);
    total += stats[2 * w + 1] * factor[w];
  }
  for (int64_t d = threadIdx.x; d < hd; d += kPagedThreads) {
    float o = 0.0f;
    for (int w = 0; w < kPagedWarps; ++w) o = fmaf(partial[w * hd + d], factor[w], o);
    out[(r * s.heads + h) * hd + d] = o / total;
  }
}

template <typename T>
__global__ void paged_cache_write_kernel(T* __restrict__ k_pool, T* __restrict__ v_pool,
                                         const float* __restrict__ k, const float* __restrict__ v, int64_t stride,
                                         const int32_t* __restrict__ block_tables,
                                         const int32_t* __restrict__ sequences,
                                         const int32_t* __restrict__ positions, int64_t rows, PagedAttentionShape s) {
  const int64_t kv_width = s.kv_heads * s.head_dim;
  for (int64_t i = grid_start(); i < rows * kv_width; i += grid_stride()) {
    const int64_t r = i / kv_width, c = i % kv_width;
    const int64_t row = cache_row(block_tables + static_cast<int64_t>(sequences[r]) * s.table_width, positions[r], s);
    k_pool[row + c] = narrow<T>(k[r * stride + c]);
    v_pool[row + c] = narrow<T>(v[r * stride + c]);
  }
}

}  // namespace

namespace {

void launch_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                      const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t past,
                      int64_t rows, const PagedAttentionShape& s, cudaStream_t stream) {
  if (rows == 0) return;
  LOOM_CHECK(rows * s.heads <= std::numeric_limits<int32_t>::max(),
             "cuda::paged_attention: " + std::to_string(rows) + " rows x " + std::to_string(s.heads) +
                 " heads exceed one grid");
  LOOM_CHECK(s.head_dim >= 1 && s.head_dim <= kMaxHeadDim, "cuda::paged_attention: head_dim " +
                                                                std::to_string(s.head_dim) + " is outside [1, " +
                                                                std::to_string(kMaxHeadDim) + "]");
  const size_t bytes = (static_cast<size_t>(s.head_dim) * (1 + kPagedWarps) + 2 * kPagedWarps) * sizeof(float);
  const auto blocks = static_cast<unsigned>(rows * s.heads);
  if (s.cache == KvCacheDtype::Bf16) {
    paged_attention_kernel<<<blocks, kPagedThreads, bytes, stream>>>(
        out, q, q_stride, static_cast<const __nv_bfloat16*>(k_pool), static_cast<const __nv_bfloat16*>(v_pool),
        block_tables, sequences, positions, past, s);
  } else {
    paged_attention_kernel<<<blocks, kPagedThreads, bytes, stream>>>(
        out, q, q_stride, static_cast<const float*>(k_pool), static_cast<const float*>(v_pool), block_tables,
        sequences, positions, past, s);
  }
  check_launch("paged_attention_kernel");
}

}  // namespace

void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s, cudaStream_t stream) {
  launch_attention(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, 0, rows, s, stream);
}

void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                      int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      cudaStream_t stream) {
  const PagedAttentionShape s{heads, kv_heads, head_dim, 1, 0};
  launch_attention(out, q, q_stride, k_cache, v_cache, nullptr, nullptr, nullptr, past, new_tokens, s, stream);
}

void paged_cache_write(void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s, cudaStream_t stream) {
  const int64_t n = rows * s.kv_heads * s.head_dim;
  if (n == 0) return;
  if (s.cache == KvCacheDtype::Bf16) {
    paged_cache_write_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(k_pool),
                                                                   static_cast<__nv_bfloat16*>(v_pool), k, v, stride,
                                                                   block_tables, sequences, positions, rows, s);
  } else {
    paged_cache_write_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<float*>(k_pool),
                                                                   static_cast<float*>(v_pool), k, v, stride,
                                                                   block_tables, sequences, positions, rows, s);
  }
  check_launch("paged_cache_write_kernel");
}

}  // namespace loom::kernels::cuda
