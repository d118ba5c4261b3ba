#include <algorithm>
#include <climits>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_tiles.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/mma.cuh"
#include "loom/kernels/cuda/paged_prompt_attention.h"
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

// Where position j of a sequence lives in the pool: its slot (block * block_size + offset). Blocks of
// a power of two positions (the engine's 16) take a shift and a mask, others a 32-bit division.
struct BlockTable {
  const int32_t* ids;
  int block_size, block_shift;  // block_shift: log2(block_size), or -1
  __device__ int64_t slot(int j) const {
    if (block_shift >= 0) return (static_cast<int64_t>(ids[j >> block_shift]) << block_shift) + (j & (block_size - 1));
    return static_cast<int64_t>(ids[j / block_size]) * block_size + j % block_size;
  }
};

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

// The smallest and largest position of the tile's rows (each warp computes both; no barrier).
__device__ void position_bounds(const int32_t* positions, int64_t first, int count, int32_t& lo, int32_t& hi) {
  lo = INT32_MAX;
  hi = INT32_MIN;
  for (int i = threadIdx.x % 32; i < count; i += 32) {
    lo = min(lo, positions[first + i]);
    hi = max(hi, positions[first + i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, offset));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, offset));
  }
}

// One prompt tile (up to 64 rows of one sequence) and one query head; each warp owns 16 rows.
// Key tiles 0, 64, ... up to the tile's last position, double-buffered: the next tile's copies in
// flight while this one is used.
// The grid is (query head, tile): the heads of the first tiles, which reach furthest, start first.
template <int D>
__global__ void __launch_bounds__(kBlockThreads, D == 64 ? 4 : 2)
    paged_prompt_kernel(float* out, const float* q, int64_t q_stride, const bf16* k_pool, const bf16* v_pool,
                        const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                        const int32_t* tiles, PagedAttentionShape s, int block_shift) {
  constexpr int S = kRowStride<D>;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  bf16* qs = reinterpret_cast<bf16*>(shared_bytes);  // [64][S], then keys [2][64][S], values [2][64][S]
  bf16* key_tiles = qs + kBlockRows * S;
  bf16* value_tiles = key_tiles + 2 * kKeyTile * S;
  const int warp = threadIdx.x / 32, row = warp * 16 + (threadIdx.x % 32) / 4;
  const int64_t first = tiles[2 * blockIdx.y];
  const int count = tiles[2 * blockIdx.y + 1];
  const int64_t h = blockIdx.x, kvh = h / (s.heads / s.kv_heads), row_width = s.kv_heads * D;
  const BlockTable table{block_tables + static_cast<int64_t>(sequences[first]) * s.table_width,
                         static_cast<int>(s.block_size), block_shift};
  int32_t lo, hi;
  position_bounds(positions, first, count, lo, hi);
  const int k_len = hi + 1;
  stage_positions<D>(key_tiles, k_pool, table, row_width, kvh * D, 0, k_len);
  stage_positions<D>(value_tiles, v_pool, table, row_width, kvh * D, 0, k_len);
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
  for (int j0 = 0; j0 < k_len; j0 += kKeyTile, buffer ^= 1) {
    const int next = j0 + kKeyTile;
    if (next < k_len) {
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
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float total = quad_sum(l[hf]);  // > 0: every row sees position 0
    const int i = row + 8 * hf;
    if (i >= count) continue;
    const float inverse = 1.0f / total;
    float* out_row = out + (first + i) * s.heads * D + h * D;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      *reinterpret_cast<float2*>(out_row + nt * 8 + 2 * t) =
          make_float2(o[nt][2 * hf] * inverse, o[nt][2 * hf + 1] * inverse);
    }
  }
}

template <int D>
void launch(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, const int32_t* tiles,
            int64_t tile_count, const PagedAttentionShape& s, cudaStream_t stream) {
  const size_t bytes = sizeof(bf16) * (kBlockRows + 2 * 2 * kKeyTile) * kRowStride<D>;  // q, two k and v buffers
  allow_shared(paged_prompt_kernel<D>, bytes, "paged_prompt_kernel");
  int block_shift = -1;
  for (int shift = 0; shift < 31; ++shift) {
    if (int64_t{1} << shift == s.block_size) block_shift = shift;
  }
  constexpr int64_t kMostTiles = 65535;  // the grid's y
  for (int64_t done = 0; done < tile_count; done += kMostTiles) {
    const dim3 grid(static_cast<unsigned>(s.heads), static_cast<unsigned>(std::min(kMostTiles, tile_count - done)));
    paged_prompt_kernel<D><<<grid, kBlockThreads, bytes, stream>>>(
        out, q, q_stride, static_cast<const bf16*>(k_pool), static_cast<const bf16*>(v_pool), block_tables, sequences,
        positions, tiles + 2 * done, s, block_shift);
    check_launch("paged_prompt_kernel");
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void paged_prompt_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            const int32_t* tiles, int64_t tile_count, const PagedAttentionShape& s,
                            cudaStream_t stream) {
  if (tile_count == 0) return;
  LOOM_CHECK(s.cache == KvCacheDtype::Bf16 && (s.head_dim == 64 || s.head_dim == 128) && q_stride % 4 == 0,
             "cuda::paged_prompt_attention: serves a bf16 cache, head_dim 64 or 128 and a q stride that is a multiple "
             "of 4 (head_dim " + std::to_string(s.head_dim) + ", q stride " + std::to_string(q_stride) + ")");
  LOOM_CHECK(aligned16(out) && aligned16(q) && aligned16(k_pool) && aligned16(v_pool),
             "cuda::paged_prompt_attention: out, q and the pools must be 16-byte aligned");
  if (s.head_dim == 64) {
    launch<64>(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, tiles, tile_count, s, stream);
  } else {
    launch<128>(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, tiles, tile_count, s, stream);
  }
}

}  // namespace loom::kernels::cuda
