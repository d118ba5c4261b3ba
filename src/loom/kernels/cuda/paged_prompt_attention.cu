#include <algorithm>
#include <optional>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/mma.cuh"
#include "loom/kernels/cuda/paged_attention.h"
#include "loom/kernels/cuda/paged_prompt_attention.h"
#include "loom/kernels/cuda/paged_slots.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/shared_memory.cuh"

namespace loom::kernels::cuda {

namespace {

using namespace attention_tiles;

constexpr int kKeyTile = 64;
static_assert(kPromptTileRows == kBlockRows, "a prompt tile is one block's queries");

// The tile's query rows of head columns [col, col + D), fp32 read 16 bytes at a time and rounded
// to bf16 into [64][D + 8]; rows past `count` become zeros (their outputs are not written).
template <int D>
__device__ void stage_queries(bf16* tile, const float* q, int64_t q_stride, int64_t first, int count, int64_t col) {
  constexpr int chunks = D / 4;
  for (int idx = threadIdx.x; idx < kBlockRows * chunks; idx += kBlockThreads) {
    const int r = idx / chunks, c = idx % chunks;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < count) x = *reinterpret_cast<const float4*>(q + (first + r) * q_stride + col + c * 4);
    auto* pair = reinterpret_cast<__nv_bfloat162*>(tile + r * kRowStride<D> + c * 4);
    pair[0] = __floats2bfloat162_rn(x.x, x.y);
    pair[1] = __floats2bfloat162_rn(x.z, x.w);
  }
}

// Positions j0 .. j0 + 63 of one kv head's keys (or values), columns [col, col + D), found through
// the sequence's block table, into [64][D + 8] by asynchronous copies; positions at or past k_len
// become zeros without a read (their slots may hold anything, NaN included).
template <int D>
__device__ void stage_positions(bf16* tile, const bf16* pool, const BlockTable& table, int64_t row_width,
                                int64_t col, int j0, int k_len) {
  constexpr int chunks = D / 8;
  for (int idx = threadIdx.x; idx < kKeyTile * chunks; idx += kBlockThreads) {
    const int r = idx / chunks, c = idx % chunks;
    const int j = j0 + r;
    const bool valid = j < k_len;
    const bf16* source = valid ? pool + table.slot(j) * row_width + col + c * 8 : pool;
    mma::copy16_async(tile + r * kRowStride<D> + c * 8, source, valid);
  }
}

// The split rows' partials (rows at position kPromptPartitionKeys or later) of one launch: per
// (row of the launch's tiles, query head, partition) the partition's max score (log2 units), the
// sum of its weights and its weighted values relative to that max.
struct PromptPartials {
  float* acc;      // [tiles * 64][heads][partitions][D]
  float* stats;    // [tiles * 64][heads][partitions][2]
  int partitions;  // per (row, head): the call's reach over kPromptPartitionKeys, rounded up
  __device__ int64_t at(int64_t row, int64_t h, int64_t heads, int partition) const {
    return (row * heads + h) * partitions + partition;
  }
};

// A row's result where it has one partition (out = O / l), else its partial of this partition;
// nothing for a partition after its position.
template <int D>
__device__ void finish_rows(float* out, const PromptPartials& partials, const float (&o)[D / 8][4],
                            const float (&m)[2], const float (&l)[2], const int32_t (&my_pos)[2], int64_t first,
                            int count, int row, int64_t h, int64_t heads, int partition) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float total = quad_sum(l[hf]);  // > 0 where written: the row sees the partition's first key
    const int i = row + 8 * hf;
    if (i >= count || my_pos[hf] < partition * kPromptPartitionKeys) continue;
    const bool alone = my_pos[hf] < kPromptPartitionKeys;
    if (!alone && partials.acc == nullptr) __trap();  // a reach short of the rows' positions
    const float scale = alone ? 1.0f / total : 1.0f;
    int64_t at = 0;
    float* target = out + (first + i) * heads * D + h * D;
    if (!alone) {
      at = partials.at(static_cast<int64_t>(blockIdx.y) * kBlockRows + i, h, heads, partition);
      target = partials.acc + at * D;
    }
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<float2*>(target + nt * 8 + 2 * t) =
          make_float2(o[nt][2 * hf] * scale, o[nt][2 * hf + 1] * scale);
    }
    if (!alone && t == 0) {
      partials.stats[2 * at] = m[hf];
      partials.stats[2 * at + 1] = total;
    }
  }
}

// One prompt tile (up to 64 rows of one sequence), one query head and one partition of
// kPromptPartitionKeys positions; each warp owns 16 rows. The partition's key tiles up to the tile's
// last position, double-buffered: the next tile's copies in flight while this one is used.
// The grid is (query head, tile, partition): within a partition, every head of the first tiles,
// which reach furthest, starts first; a partition after the tile's last position ends at once.
template <int D>
__global__ void __launch_bounds__(kBlockThreads, D == 64 ? 4 : 2)
    paged_prompt_kernel(float* out, PromptPartials partials, const float* q, int64_t q_stride, const bf16* k_pool,
                        const bf16* v_pool, const int32_t* block_tables, const int32_t* sequences,
                        const int32_t* positions, const int32_t* tiles, PagedAttentionShape s) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S], then keys [2][64][S], values [2][64][S]
  bf16* key_tiles = qs + kBlockRows * S;
  bf16* value_tiles = key_tiles + 2 * kKeyTile * S;
  const int warp = threadIdx.x / 32, row = warp * 16 + (threadIdx.x % 32) / 4;
  const int64_t first = tiles[2 * blockIdx.y];
  const int count = tiles[2 * blockIdx.y + 1];
  const int32_t lo = positions[first];  // a tile's positions are consecutive
  const int k_len = positions[first + count - 1] + 1, partition = static_cast<int>(blockIdx.z);
  const int j_begin = partition * static_cast<int>(kPromptPartitionKeys);
  if (j_begin >= k_len) return;  // the whole block: before any barrier
  const int j_end = min(k_len, j_begin + static_cast<int>(kPromptPartitionKeys));
  const int64_t h = blockIdx.x, kvh = h / (s.heads / s.kv_heads), row_width = s.kv_heads * D;
  const BlockTable table(block_tables + static_cast<int64_t>(sequences[first]) * s.table_width, s.block_size);
  stage_positions<D>(key_tiles, k_pool, table, row_width, kvh * D, j_begin, k_len);
  stage_positions<D>(value_tiles, v_pool, table, row_width, kvh * D, j_begin, k_len);
  mma::copies_commit();
  stage_queries<D>(qs, q, q_stride, first, count, h * D);
  int32_t my_pos[2];
  const int32_t my_doc[2] = {0, 0};
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) my_pos[hf] = positions[first + min(row + 8 * hf, count - 1)];
  const Tokens keys{nullptr, nullptr, k_len};  // a key's position is its index; one document
  const float scale_log2 = kLog2e / sqrtf(static_cast<float>(D));
  float o[D / 8][4] = {};
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.0f, 0.0f};
  int buffer = 0;
  for (int j0 = j_begin; j0 < j_end; j0 += kKeyTile, buffer ^= 1) {
    const int next = j0 + kKeyTile;
    if (next < j_end) {
      stage_positions<D>(key_tiles + (buffer ^ 1) * kKeyTile * S, k_pool, table, row_width, kvh * D, next, k_len);
      stage_positions<D>(value_tiles + (buffer ^ 1) * kKeyTile * S, v_pool, table, row_width, kvh * D, next, k_len);
    }
    mma::copies_commit();
    mma::copies_wait_all_but_last();
    __syncthreads();  // this tile's copies (and, the first time, the queries' stores) are visible
    // Some key of the tile comes after the tile's first query: the per-element test is needed.
    const bool masked = j0 + kKeyTile - 1 > lo;
    float sc[kKeyTile / 8][4] = {}, correction[2];
    row_products<D, kKeyTile>(sc, qs, key_tiles + buffer * kKeyTile * S, warp);
    online_softmax<kKeyTile>(sc, m, l, correction, masked, j0, k_len, keys, 0, my_pos, my_doc, scale_log2);
    rescale_rows<D>(o, correction);
    accumulate_products<D, kKeyTile>(o, sc, value_tiles + buffer * kKeyTile * S);
    __syncthreads();  // this buffer's readers are done before the tile after next refills it
  }
  finish_rows<D>(out, partials, o, m, l, my_pos, first, count, row, h, s.heads, partition);
}

// The split rows' partials merged in partition order (partitions 0 .. position / kPromptPartitionKeys,
// which depend on the row's position only): out = sum_p O_p f_p / sum_p l_p f_p with
// f_p = 2^(m_p - max m). A warp per row and head at a time; grid (query head, tile).
template <int D>
__global__ void __launch_bounds__(kBlockThreads) paged_prompt_merge_kernel(float* out, PromptPartials partials,
                                                                           const int32_t* positions,
                                                                           const int32_t* tiles, int64_t heads) {
  const int lane = threadIdx.x % 32;
  const int64_t h = blockIdx.x, first = tiles[2 * blockIdx.y];
  const int count = tiles[2 * blockIdx.y + 1];
  for (int i = threadIdx.x / 32; i < count; i += kBlockThreads / 32) {
    const int position = positions[first + i];
    if (position < kPromptPartitionKeys) continue;  // written whole by its one partition
    const int n = position / static_cast<int>(kPromptPartitionKeys) + 1;
    if (n > partials.partitions) __trap();  // a reach short of the rows' positions
    const int64_t base = partials.at(static_cast<int64_t>(blockIdx.y) * kBlockRows + i, h, heads, 0);
    float top = kNegInf;
    for (int p = 0; p < n; ++p) top = fmaxf(top, partials.stats[2 * (base + p)]);
    float total = 0.0f, acc[D / 32] = {};
    for (int p = 0; p < n; ++p) {
      const float m = partials.stats[2 * (base + p)];
      const float factor = m == top ? 1.0f : mma::fast_exp2(m - top);
      total += partials.stats[2 * (base + p) + 1] * factor;
#pragma unroll
      for (int c = 0; c < D / 32; ++c) acc[c] += partials.acc[(base + p) * D + lane + 32 * c] * factor;
    }
    const float inverse = 1.0f / total;
    float* out_row = out + (first + i) * heads * D + h * D;
#pragma unroll
    for (int c = 0; c < D / 32; ++c) out_row[lane + 32 * c] = acc[c] * inverse;
  }
}

template <int D>
void launch(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, const int32_t* tiles,
            int64_t tile_count, int64_t reach, const PagedAttentionShape& s, cudaStream_t stream) {
  const size_t bytes = sizeof(bf16) * (kBlockRows + 2 * 2 * kKeyTile) * kRowStride<D>;  // q, two k and v buffers
  allow_shared(paged_prompt_kernel<D>, bytes, "paged_prompt_kernel");
  const int64_t partitions = std::max<int64_t>(1, (reach + kPromptPartitionKeys - 1) / kPromptPartitionKeys);
  LOOM_CHECK(partitions <= 65535, "cuda::paged_prompt_attention: prompt rows reaching position " +
                                      std::to_string(reach) + " need more than 65535 partitions");
  // The tiles one launch takes: the grid's y, and partials of at most kPagedPartialBytes (or one
  // tile's, if more).
  int64_t per_launch = 65535;
  std::optional<Scratch> scratch;  // only where some row is split
  PromptPartials partials{nullptr, nullptr, static_cast<int>(partitions)};
  if (partitions > 1) {
    const int64_t tile_floats = kBlockRows * s.heads * partitions * (D + 2);
    per_launch = std::clamp<int64_t>(kPagedPartialBytes / (tile_floats * static_cast<int64_t>(sizeof(float))), 1,
                                     per_launch);
    const int64_t held = std::min(tile_count, per_launch) * kBlockRows * s.heads * partitions;
    scratch.emplace();
    partials.acc = scratch->floats(held * D);
    partials.stats = scratch->floats(2 * held);
  }
  for (int64_t done = 0; done < tile_count; done += per_launch) {
    const auto n = static_cast<unsigned>(std::min(per_launch, tile_count - done));
    const dim3 grid(static_cast<unsigned>(s.heads), n, static_cast<unsigned>(partitions));
    paged_prompt_kernel<D><<<grid, kBlockThreads, bytes, stream>>>(
        out, partials, q, q_stride, static_cast<const bf16*>(k_pool), static_cast<const bf16*>(v_pool), block_tables,
        sequences, positions, tiles + 2 * done, s);
    check_launch("paged_prompt_kernel");
    if (partitions == 1) continue;
    paged_prompt_merge_kernel<D><<<dim3(static_cast<unsigned>(s.heads), n), kBlockThreads, 0, stream>>>(
        out, partials, positions, tiles + 2 * done, s.heads);
    check_launch("paged_prompt_merge_kernel");
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void paged_prompt_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            const int32_t* tiles, int64_t tile_count, int64_t reach, const PagedAttentionShape& s,
                            cudaStream_t stream) {
  if (tile_count == 0) return;
  LOOM_CHECK(reach >= 1, "cuda::paged_prompt_attention: a reach of " + std::to_string(reach) +
                             " for prompt rows (one more than their last position)");
  LOOM_CHECK(s.cache == KvCacheDtype::Bf16 && (s.head_dim == 64 || s.head_dim == 128) && q_stride % 4 == 0,
             "cuda::paged_prompt_attention: serves a bf16 cache, head_dim 64 or 128 and a q stride that is a multiple "
             "of 4 (head_dim " + std::to_string(s.head_dim) + ", q stride " + std::to_string(q_stride) + ")");
  LOOM_CHECK(aligned16(out) && aligned16(q) && aligned16(k_pool) && aligned16(v_pool),
             "cuda::paged_prompt_attention: out, q and the pools must be 16-byte aligned");
  if (s.head_dim == 64) {
    launch<64>(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, tiles, tile_count, reach, s,
               stream);
  } else {
    launch<128>(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, tiles, tile_count, reach, s,
                stream);
  }
}

}  // namespace loom::kernels::cuda
