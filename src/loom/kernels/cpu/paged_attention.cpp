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

// Keys (or values) taken a tile at a time: read, and widened, once for all the heads of a GQA
// group while the tile stays in L1.
constexpr int64_t kTile = 32;
constexpr int64_t kLanes = 8;  // output columns kept in one vector register while a tile is added

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
  // A unit per (row, kv head): each key and value row is read (and, in a bf16 pool, widened) once
  // for the group's query heads, a tile of rows at a time, not once per head. Each head's
  // arithmetic is the same, in the same order, as with a unit per head.
#pragma omp parallel if(worth_parallel(work))
  {
    std::vector<float> p(static_cast<size_t>(group * longest)), room(kTile * hd), sums(group);
    const float* tile[kTile];
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        const int32_t* table = block_tables + static_cast<int64_t>(sequences[r]) * s.table_width;
        const int64_t len = positions[r] + 1, kv_off = g * hd;
        // Rows [first, first + n) of a pool as fp32 rows in `tile`.
        auto take_tile = [&](const void* pool, int64_t first, int64_t n) {
          int64_t entry = first / s.block_size, slot = first % s.block_size;  // then stepped, not divided
          for (int64_t t = 0; t < n; ++t) {
            const int64_t offset = (static_cast<int64_t>(table[entry]) * s.block_size + slot) * kv_width + kv_off;
            tile[t] = pool_row(pool, offset, hd, s.cache, room.data() + t * hd);
            if (++slot == s.block_size) {
              slot = 0;
              ++entry;
            }
          }
        };
        const float* q_group = q + r * q_stride + g * group * hd;  // the group's heads, hd apart
        for (int64_t first = 0; first < len; first += kTile) {
          const int64_t n = std::min(kTile, len - first);
          take_tile(k_pool, first, n);
          for (int64_t i = 0; i < group; ++i) {
            for (int64_t t = 0; t < n; ++t) p[i * len + first + t] = dot(q_group + i * hd, tile[t], hd) * scale;
          }
        }
        for (int64_t i = 0; i < group; ++i) {
          float* pi = p.data() + i * len;
          float max_score = -INFINITY;
          for (int64_t t = 0; t < len; ++t) max_score = std::max(max_score, pi[t]);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = 0; t < len; ++t) {
            pi[t] = fast_exp(pi[t] - max_score);
            sum += pi[t];
          }
          sums[i] = sum;
        }
        float* o = out + (r * s.heads + g * group) * hd;  // the group's heads' outputs, hd apart
        std::fill(o, o + group * hd, 0.0f);
        for (int64_t first = 0; first < len; first += kTile) {
          const int64_t n = std::min(kTile, len - first);
          take_tile(v_pool, first, n);
          for (int64_t i = 0; i < group; ++i) {
            float weight[kTile];
            for (int64_t t = 0; t < n; ++t) weight[t] = p[i * len + first + t] / sums[i];
            // The tile's values added into the head's output in position order, as one axpy per
            // position would (the same bits), each output element kept in a register meanwhile.
            float* oi = o + i * hd;
            int64_t d = 0;
            for (; d + kLanes <= hd; d += kLanes) {
              float sum[kLanes];
              for (int64_t k = 0; k < kLanes; ++k) sum[k] = oi[d + k];
              for (int64_t t = 0; t < n; ++t) {
                const float* row = tile[t] + d;
#pragma omp simd
                for (int64_t k = 0; k < kLanes; ++k) sum[k] += weight[t] * row[k];
              }
              for (int64_t k = 0; k < kLanes; ++k) oi[d + k] = sum[k];
            }
            for (; d < hd; ++d) {
              float sum = oi[d];
              for (int64_t t = 0; t < n; ++t) sum += weight[t] * tile[t][d];
              oi[d] = sum;
            }
          }
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
