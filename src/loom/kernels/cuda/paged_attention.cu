#include <cmath>
#include <limits>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/paged_attention.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kPagedThreads = 128;  // keys per tile: one per thread

// The float offset of position t's row in a pool, through the sequence's block table (none: one
// contiguous cache, attention_decode's).
__device__ inline int64_t cache_row(const int32_t* table, int64_t t, const PagedAttentionShape& s) {
  const int64_t slot = table ? static_cast<int64_t>(table[t / s.block_size]) * s.block_size + t % s.block_size : t;
  return slot * (s.kv_heads * s.head_dim);
}

// Block (row, head): shared memory holds q, the output's accumulators, one tile's weights and
// rows, and the reductions' partials.
__global__ void __launch_bounds__(kPagedThreads)
    paged_attention_kernel(float* __restrict__ out, const float* __restrict__ q, int64_t q_stride,
                           const float* __restrict__ k_pool, const float* __restrict__ v_pool,
                           const int32_t* __restrict__ block_tables, const int32_t* __restrict__ sequences,
                           const int32_t* __restrict__ positions, int64_t past, PagedAttentionShape s) {
  extern __shared__ int64_t tile_rows[];  // [kPagedThreads], then the floats
  const int64_t hd = s.head_dim;
  float* partial = reinterpret_cast<float*>(tile_rows + kPagedThreads);
  float* weight = partial + kPagedThreads / 32;
  float* qs = weight + kPagedThreads;
  float* acc = qs + hd;
  const int64_t r = blockIdx.x / s.heads, h = blockIdx.x % s.heads;
  // Paged rows carry their sequence and position; without tables, row r is position past + r.
  const int32_t* table = block_tables ? block_tables + static_cast<int64_t>(sequences[r]) * s.table_width : nullptr;
  const int64_t len = (block_tables ? static_cast<int64_t>(positions[r]) : past + r) + 1;
  const int64_t kv_off = (h / (s.heads / s.kv_heads)) * hd;
  const float scale = 1.0f / sqrtf(static_cast<float>(hd));
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t d = tid; d < hd; d += kPagedThreads) {
    qs[d] = q[r * q_stride + h * hd + d];
    acc[d] = 0.0f;
  }
  __syncthreads();
  auto score = [&](int64_t row) {
    const float* k = k_pool + row + kv_off;
    float dot = 0.0f;
    for (int64_t d = 0; d < hd; ++d) dot = fmaf(qs[d], k[d], dot);
    return dot * scale;
  };
  float max_score = -INFINITY;
  for (int64_t t = tid; t < len; t += kPagedThreads) max_score = fmaxf(max_score, score(cache_row(table, t, s)));
  max_score = block_max(max_score, partial);
  float sum = 0.0f;
  for (int64_t t = tid; t < len; t += kPagedThreads) sum += expf(score(cache_row(table, t, s)) - max_score);
  sum = block_sum(sum, partial);
  for (int64_t first = 0; first < len; first += kPagedThreads) {
    const int64_t t = first + tid;
    if (t < len) {
      const int64_t row = cache_row(table, t, s);
      tile_rows[tid] = row;
      weight[tid] = expf(score(row) - max_score) / sum;
    }
    __syncthreads();
    const int64_t n = min(static_cast<int64_t>(kPagedThreads), len - first);
    for (int64_t d = tid; d < hd; d += kPagedThreads) {
      float a = acc[d];
      for (int64_t i = 0; i < n; ++i) a = fmaf(weight[i], v_pool[tile_rows[i] + kv_off + d], a);
      acc[d] = a;
    }
    __syncthreads();
  }
  for (int64_t d = tid; d < hd; d += kPagedThreads) out[(r * s.heads + h) * hd + d] = acc[d];
}

__global__ void paged_cache_write_kernel(float* __restrict__ k_pool, float* __restrict__ v_pool,
                                         const float* __restrict__ k, const float* __restrict__ v, int64_t stride,
                                         const int32_t* __restrict__ block_tables,
                                         const int32_t* __restrict__ sequences,
                                         const int32_t* __restrict__ positions, int64_t rows, PagedAttentionShape s) {
  const int64_t kv_width = s.kv_heads * s.head_dim;
  for (int64_t i = grid_start(); i < rows * kv_width; i += grid_stride()) {
    const int64_t r = i / kv_width, c = i % kv_width;
    const int64_t row = cache_row(block_tables + static_cast<int64_t>(sequences[r]) * s.table_width, positions[r], s);
    k_pool[row + c] = k[r * stride + c];
    v_pool[row + c] = v[r * stride + c];
  }
}

}  // namespace

namespace {

void launch_attention(float* out, const float* q, int64_t q_stride, const float* k_pool, const float* v_pool,
                      const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t past,
                      int64_t rows, const PagedAttentionShape& s, cudaStream_t stream) {
  if (rows == 0) return;
  LOOM_CHECK(rows * s.heads <= std::numeric_limits<int32_t>::max(),
             "cuda::paged_attention: " + std::to_string(rows) + " rows x " + std::to_string(s.heads) +
                 " heads exceed one grid");
  const size_t bytes = kPagedThreads * sizeof(int64_t) +
                       (kPagedThreads / 32 + kPagedThreads + 2 * static_cast<size_t>(s.head_dim)) * sizeof(float);
  LOOM_CHECK(bytes <= 48 * 1024, "cuda::paged_attention: head_dim " + std::to_string(s.head_dim) + " is too large");
  paged_attention_kernel<<<static_cast<unsigned>(rows * s.heads), kPagedThreads, bytes, stream>>>(
      out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, past, s);
  check_launch("paged_attention_kernel");
}

}  // namespace

void paged_attention(float* out, const float* q, int64_t q_stride, const float* k_pool, const float* v_pool,
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

void paged_cache_write(float* k_pool, float* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s, cudaStream_t stream) {
  const int64_t n = rows * s.kv_heads * s.head_dim;
  if (n == 0) return;
  paged_cache_write_kernel<<<grid_for(n), kThreads, 0, stream>>>(k_pool, v_pool, k, v, stride, block_tables, sequences,
                                                                 positions, rows, s);
  check_launch("paged_cache_write_kernel");
}

}  // namespace loom::kernels::cuda
