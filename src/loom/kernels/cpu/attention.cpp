#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/kernels/cpu/parallel.h"
#include "loom/kernels/cpu/vector_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace loom::kernels::cpu {

void reference_attention_forward(float* out, float* probs, const float* qkv, const AttentionShape& s) {
  const int64_t T = s.seq, hs = s.head_dim, W = s.qkv_width();
  const int64_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
#pragma omp parallel for collapse(2) schedule(static) if(worth_parallel(s.batch * s.heads * T * T * hs))
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t kvh = h / group;
      const float* base = qkv + b * T * W;
      const int64_t k_off = s.heads * hs + kvh * hs, v_off = (s.heads + s.kv_heads) * hs + kvh * hs;
      for (int64_t t = 0; t < T; ++t) {
        const float* q = base + t * W + h * hs;
        float* p = probs + ((b * s.heads + h) * T + t) * T;
        float max_score = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          p[t2] = dot(q, base + t2 * W + k_off, hs) * scale;
          max_score = std::max(max_score, p[t2]);
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          p[t2] = fast_exp(p[t2] - max_score);
          sum += p[t2];
        }
        float inv = 1.0f / sum;
        float* o = out + (b * T + t) * s.heads * hs + h * hs;
        for (int64_t i = 0; i < hs; ++i) o[i] = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          p[t2] *= inv;
          axpy(o, p[t2], base + t2 * W + v_off, hs);
        }
      }
    }
  }
}

void reference_attention_backward(float* dqkv, const float* dout, const float* probs, const float* qkv,
                                  const AttentionShape& s) {
  const int64_t T = s.seq, hs = s.head_dim, W = s.qkv_width();
  const int64_t group = s.heads / s.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // One task per (batch, kv head): the query heads sharing a kv head write the same dk/dv rows.
#pragma omp parallel if(worth_parallel(s.batch * s.heads * T * T * hs))
  {
    std::vector<float> dp(T);
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t kvh = 0; kvh < s.kv_heads; ++kvh) {
        const float* base = qkv + b * T * W;
        float* dbase = dqkv + b * T * W;
        const int64_t k_off = s.heads * hs + kvh * hs, v_off = (s.heads + s.kv_heads) * hs + kvh * hs;
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t t = 0; t < T; ++t) {
            const float* p = probs + ((b * s.heads + h) * T + t) * T;
            const float* dy = dout + (b * T + t) * s.heads * hs + h * hs;
            float sum_p_dp = 0.0f;
            for (int64_t t2 = 0; t2 <= t; ++t2) {
              dp[t2] = dot(dy, base + t2 * W + v_off, hs);
              sum_p_dp += p[t2] * dp[t2];
              axpy(dbase + t2 * W + v_off, p[t2], dy, hs);
            }
            const float* q = base + t * W + h * hs;
            float* dq = dbase + t * W + h * hs;
            for (int64_t t2 = 0; t2 <= t; ++t2) {
              float dscore = p[t2] * (dp[t2] - sum_p_dp) * scale;
              axpy(dq, dscore, base + t2 * W + k_off, hs);
              axpy(dbase + t2 * W + k_off, dscore, q, hs);
            }
          }
        }
      }
    }
  }
}

void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache,
                      const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads,
                      int64_t kv_heads, int64_t head_dim) {
  // The paged kernel over one block that holds the whole cache: each head's arithmetic is what a
  // loop per (row, head) over the contiguous rows computes, and each key and value row is read
  // once per GQA group.
  const int64_t length = past + new_tokens;
  const int32_t table = 0;
  std::vector<int32_t> sequences(static_cast<size_t>(new_tokens), 0), positions(static_cast<size_t>(new_tokens));
  for (int64_t i = 0; i < new_tokens; ++i) positions[static_cast<size_t>(i)] = static_cast<int32_t>(past + i);
  const PagedAttentionShape shape{heads, kv_heads, head_dim, std::max<int64_t>(length, 1), 1, KvCacheDtype::Fp32};
  paged_attention(out, q, q_stride, k_cache, v_cache, &table, sequences.data(), positions.data(), new_tokens, shape);
}

}  // namespace loom::kernels::cpu
