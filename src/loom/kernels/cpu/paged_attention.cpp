#include "loom/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vector_ops.h"

namespace loom::kernels::cpu {

namespace {

// A pool row of hd elements as fp32: the row itself in an fp32 pool, else widened into `room`.
const float* pool_row(const void* pool, int64_t offset, int64_t hd, KvCacheDtype dtype, float* room) {
  if (dtype == KvCacheDtype::Fp32) return static_cast<const float*>(pool) + offset;
  const uint16_t* row = static_cast<const uint16_t*>(pool) + offset;
  for (int64_t d = 0; d < hd; ++d) room[d] = bf16_to_f32(row[d]);
  return room;
}

}  // namespace

void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s) {
  const int64_t group = s.heads / s.kv_heads, kv_width = s.kv_heads * s.head_dim, hd = s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  int64_t longest = 0, work = 0;
  for (int64_t r = 0; r < rows; ++r) {
    longest = std::max<int64_t>(longest, positions[r] + 1);
    work += (positions[r] + 1) * s.heads * hd;
  }
#pragma omp parallel if(worth_parallel(work))
  {
    std::vector<float> p(longest), widened(hd);
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int32_t* table = block_tables + static_cast<int64_t>(sequences[r]) * s.table_width;
        const int64_t len = positions[r] + 1, kv_off = (h / group) * hd;
        auto slot = [&](int64_t t) {
          return (static_cast<int64_t>(table[t / s.block_size]) * s.block_size + t % s.block_size) * kv_width + kv_off;
        };
        const float* qi = q + r * q_stride + h * hd;
        float max_score = -INFINITY;
        for (int64_t t = 0; t < len; ++t) {
          p[t] = dot(qi, pool_row(k_pool, slot(t), hd, s.cache, widened.data()), hd) * scale;
          max_score = std::max(max_score, p[t]);
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
          p[t] = fast_exp(p[t] - max_score);
          sum += p[t];
        }
        float* o = out + (r * s.heads + h) * hd;
        std::fill(o, o + hd, 0.0f);
        for (int64_t t = 0; t < len; ++t) {
          axpy(o, p[t] / sum, pool_row(v_pool, slot(t), hd, s.cache, widened.data()), hd);
        }
      }
    }
  }
}

void paged_cache_write(void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s) {
  const int64_t kv_width = s.kv_heads * s.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = positions[r];
    const int32_t block = block_tables[static_cast<int64_t>(sequences[r]) * s.table_width + pos / s.block_size];
    const int64_t slot = (static_cast<int64_t>(block) * s.block_size + pos % s.block_size) * kv_width;
    const float *key = k + r * stride, *value = v + r * stride;
    if (s.cache == KvCacheDtype::Fp32) {
      std::copy(key, key + kv_width, static_cast<float*>(k_pool) + slot);
      std::copy(value, value + kv_width, static_cast<float*>(v_pool) + slot);
      continue;
    }
    uint16_t *keys = static_cast<uint16_t*>(k_pool) + slot, *values = static_cast<uint16_t*>(v_pool) + slot;
    for (int64_t c = 0; c < kv_width; ++c) {
      keys[c] = f32_to_bf16(key[c]);
      values[c] = f32_to_bf16(value[c]);
    }
  }
}

}  // namespace loom::kernels::cpu
