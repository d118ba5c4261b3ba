#include "loom/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
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

// One sequence's rows of one kv head in a pool.
struct HeadRows {
  const int32_t* table;  // the sequence's block table
  const PagedAttentionShape& s;
  int64_t kv_off;  // the kv head's first column in a pool row
};

// Positions [first, first + n) of `rows` in `pool` as fp32 rows (`room`: kTile x head_dim, where
// bf16 rows are widened); the block table stepped, not divided, per position.
void take_tile(const HeadRows& rows, const void* pool, int64_t first, int64_t n, const float** tile, float* room) {
  const PagedAttentionShape& s = rows.s;
  const int64_t kv_width = s.kv_heads * s.head_dim;
  int64_t entry = first / s.block_size, slot = first % s.block_size;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t offset = (static_cast<int64_t>(rows.table[entry]) * s.block_size + slot) * kv_width + rows.kv_off;
    tile[t] = pool_row(pool, offset, s.head_dim, s.cache, room + t * s.head_dim);
    if (++slot == s.block_size) {
      slot = 0;
      ++entry;
    }
  }
}

// out[d] += weight[t] * tile[t][d] for t = 0 .. n-1 in that order (the bits of one axpy per t),
// kLanes output columns held in a register across the tile.
void add_weighted_rows(float* out, const float* weight, const float* const* tile, int64_t n, int64_t hd) {
  int64_t d = 0;
  for (; d + kLanes <= hd; d += kLanes) {
    float sum[kLanes];
    for (int64_t k = 0; k < kLanes; ++k) sum[k] = out[d + k];
    for (int64_t t = 0; t < n; ++t) {
      const float* row = tile[t] + d;
#pragma omp simd
      for (int64_t k = 0; k < kLanes; ++k) sum[k] += weight[t] * row[k];
    }
    for (int64_t k = 0; k < kLanes; ++k) out[d + k] = sum[k];
  }
  for (; d < hd; ++d) {
    float sum = out[d];
    for (int64_t t = 0; t < n; ++t) sum += weight[t] * tile[t][d];
    out[d] = sum;
  }
}

// Per-thread room for one (row, kv head) unit.
struct GroupScratch {
  GroupScratch(int64_t group, int64_t longest, int64_t hd)
      : p(static_cast<size_t>(group * longest)), room(static_cast<size_t>(kTile * hd)), sums(group) {}
  std::vector<float> p, room, sums;  // [group, len] scores then weights; widened rows; softmax sums
  const float* tile[kTile];
};

// The `group` query heads q_group (hd apart) of one row over its `len` positions of one kv head,
// into out (hd apart): per head, the scores, their softmax and the weighted values, each as a
// unit per head would compute them, in the same order.
void attend_group(float* out, const float* q_group, int64_t group, int64_t len, const HeadRows& rows,
                  const void* k_pool, const void* v_pool, GroupScratch& g) {
  const int64_t hd = rows.s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t first = 0; first < len; first += kTile) {
    const int64_t n = std::min(kTile, len - first);
    take_tile(rows, k_pool, first, n, g.tile, g.room.data());
    for (int64_t i = 0; i < group; ++i) {
      for (int64_t t = 0; t < n; ++t) g.p[i * len + first + t] = dot(q_group + i * hd, g.tile[t], hd) * scale;
    }
  }
  for (int64_t i = 0; i < group; ++i) {
    float* pi = g.p.data() + i * len;
    float max_score = -INFINITY;
    for (int64_t t = 0; t < len; ++t) max_score = std::max(max_score, pi[t]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = 0; t < len; ++t) {
      pi[t] = fast_exp(pi[t] - max_score);
      sum += pi[t];
    }
    g.sums[i] = sum;
  }
  std::fill(out, out + group * hd, 0.0f);
  for (int64_t first = 0; first < len; first += kTile) {
    const int64_t n = std::min(kTile, len - first);
    take_tile(rows, v_pool, first, n, g.tile, g.room.data());
    for (int64_t i = 0; i < group; ++i) {
      float weight[kTile];
      for (int64_t t = 0; t < n; ++t) weight[t] = g.p[i * len + first + t] / g.sums[i];
      add_weighted_rows(out + i * hd, weight, g.tile, n, hd);
    }
  }
}

}  // namespace

void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s) {
  const int64_t group = s.heads / s.kv_heads, hd = s.head_dim;
  int64_t longest = 0, work = 0;
  for (int64_t r = 0; r < rows; ++r) {
    longest = std::max<int64_t>(longest, positions[r] + 1);
    work += (positions[r] + 1) * s.heads * hd;
  }
  // A unit per (row, kv head): each key and value row is read (and, in a bf16 pool, widened) once
  // for the group's query heads, a tile of rows at a time, not once per head.
#pragma omp parallel if(worth_parallel(work))
  {
    GroupScratch scratch(group, longest, hd);
#pragma omp for collapse(2) schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < s.kv_heads; ++g) {
        const HeadRows head_rows{block_tables + static_cast<int64_t>(sequences[r]) * s.table_width, s, g * hd};
        attend_group(out + (r * s.heads + g * group) * hd, q + r * q_stride + g * group * hd, group,
                     positions[r] + 1, head_rows, k_pool, v_pool, scratch);
      }
    }
  }
}

void paged_prompt_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            const int32_t* tiles, int64_t tile_count, int64_t reach, const PagedAttentionShape& s) {
  for (int64_t t = 0; t < tile_count; ++t) {
    const int64_t first = tiles[2 * t], rows = tiles[2 * t + 1];
    const auto tile = [t] { return "paged_prompt_attention: tile " + std::to_string(t); };  // only on an error
    LOOM_CHECK(first >= 0 && rows >= 1 && rows <= kPromptTileRows,
               tile() + " has " + std::to_string(rows) + " rows from row " + std::to_string(first) + " (1 to " +
                   std::to_string(kPromptTileRows) + " rows)");
    for (int64_t r = first; r < first + rows; ++r) {
      LOOM_CHECK(sequences[r] == sequences[first], tile() + " mixes table entries " + std::to_string(sequences[first]) +
                                                       " and " + std::to_string(sequences[r]));
      LOOM_CHECK(positions[r] < reach, tile() + "'s row " + std::to_string(r) + " at position " +
                                           std::to_string(positions[r]) + " is past the reach " +
                                           std::to_string(reach));
    }
    paged_attention(out + first * s.heads * s.head_dim, q + first * q_stride, q_stride, k_pool, v_pool, block_tables,
                    sequences + first, positions + first, rows, s);
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
