#include "loom/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vector_ops.h"

namespace loom::kernels::cpu {

void paged_attention(float* out, const float* q, int64_t q_stride, const float* k_pool, const float* v_pool,
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
    std::vector<float> p(longest);
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
          p[t] = dot(qi, k_pool + slot(t), hd) * scale;
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
        for (int64_t t = 0; t < len; ++t) axpy(o, p[t] / sum, v_pool + slot(t), hd);
      }
    }
  }
}

void paged_cache_write(float* k_pool, float* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& s) {
  const int64_t kv_width = s.kv_heads * s.head_dim;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t pos = positions[r];
    const int32_t block = block_tables[static_cast<int64_t>(sequences[r]) * s.table_width + pos / s.block_size];
    const int64_t slot = (static_cast<int64_t>(block) * s.block_size + pos % s.block_size) * kv_width;
    std::copy(k + r * stride, k + r * stride + kv_width, k_pool + slot);
    std::copy(v + r * stride, v + r * stride + kv_width, v_pool + slot);
  }
}

}  // namespace loom::kernels::cpu
