#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/paged_attention.h"
#include "loom/kernels/cuda/paged_slots.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kPagedThreads = 128;
constexpr int kPagedWarps = kPagedThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kGroupHeads = 8;  // query heads per block at most: a GQA group's, or a slice of a larger one
// Scores are kept in log2 units (exp2 is one instruction); the scale folds in log2(e).
constexpr float kLog2e = 1.4426950408889634f;

// A pool element as fp32 (bf16 widens exactly), and an fp32 value as one (bf16: nearest even).
__device__ inline float widen(float x) { return x; }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ inline T narrow(float x);
template <>
__device__ inline float narrow<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 narrow<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// The element offset of position t's row in a pool, through the sequence's block table (no ids:
// one contiguous cache, attention_decode's).
__device__ inline int64_t cache_row(const BlockTable& table, int32_t t, const PagedAttentionShape& s) {
  return table.slot(t) * (s.kv_heads * s.head_dim);
}

// The head_dim column of a lane's j-th element: adjacent pairs (2 lane, 2 lane + 1) per 64
// columns, so a row piece is one 4-byte (bf16) or 8-byte (fp32) load per lane and pair; one
// column per lane where head_dim fits 32 lanes (kPerLane 1).
template <int kPerLane>
__device__ __forceinline__ int64_t lane_column(int lane, int j) {
  if constexpr (kPerLane == 1) {
    return lane;
  } else {
    return 64 * (j / 2) + 2 * lane + (j % 2);
  }
}

// Columns d and d + 1 (d even) of a pool row as fp32, 0 past head_dim hd: one paired load where
// hd is even (rows then start at even elements, aligned for it), else one load per column.
__device__ __forceinline__ float2 load_pair(const float* row, int64_t d, int64_t hd) {
  if (hd % 2 == 0) return d < hd ? *reinterpret_cast<const float2*>(row + d) : make_float2(0.0f, 0.0f);
  return make_float2(d < hd ? row[d] : 0.0f, d + 1 < hd ? row[d + 1] : 0.0f);
}
__device__ __forceinline__ float2 load_pair(const __nv_bfloat16* row, int64_t d, int64_t hd) {
  if (hd % 2 == 0)
    return d < hd ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(row + d)) : make_float2(0.0f, 0.0f);
  return make_float2(d < hd ? widen(row[d]) : 0.0f, d + 1 < hd ? widen(row[d + 1]) : 0.0f);
}

// A lane's kPerLane elements of a pool row (lane_column's columns) as fp32, 0 past head_dim.
template <int kPerLane, typename T>
__device__ __forceinline__ void load_row(float (&x)[kPerLane], const T* row, int lane, int64_t hd) {
  if constexpr (kPerLane == 1) {
    x[0] = lane < hd ? widen(row[lane]) : 0.0f;
  } else {
#pragma unroll
    for (int j = 0; j < kPerLane; j += 2) {
      const float2 pair = load_pair(row, lane_column<kPerLane>(lane, j), hd);
      x[j] = pair.x;
      x[j + 1] = pair.y;
    }
  }
}

// Keys a warp loads before it uses any (more loads in flight per warp), fewer for wide heads,
// whose rows already take more registers.
template <int kPerLane>
inline constexpr int kKeysInFlight = kPerLane <= 2 ? 4 : (kPerLane == 4 ? 2 : 1);

template <int V>
inline constexpr int kLog2 = V <= 1 ? 0 : 1 + kLog2<V / 2>;

// Step kStep of warp_sums' first phase and the steps after it: each lane keeps one half of the
// values it holds (the upper half where its lane bit at this offset is set) and adds its
// partner's same half. Compile-time sizes throughout, so the values stay in registers.
template <int kStep, int V>
__device__ __forceinline__ void keep_halves(float (&v)[V], int lane) {
  if constexpr ((V >> kStep) > 1) {
    constexpr int kHalf = (V >> kStep) / 2, kOffset = 16 >> kStep;
    const bool upper = (lane & kOffset) != 0;
#pragma unroll
    for (int k = 0; k < kHalf; ++k) {
      const float send = upper ? v[k] : v[k + kHalf];
      const float keep = upper ? v[k + kHalf] : v[k];
      v[k] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
    }
    keep_halves<kStep + 1>(v, lane);
  }
}

// The sums over the warp's 32 lanes of each of V values (V a power of two up to 32), every lane
// getting all V: log2(V) halving steps (keep_halves: V - 1 shuffles in all), plain butterfly
// steps for the one sum left per lane, and V broadcasts (sum k ends in the 32 / V lanes from
// k * 32 / V): 2V + 4 - log2 V shuffles instead of 5V for a warp_sum of each. Each sum is added
// in warp_sum's order, so the bits are warp_sum's, the same in every lane and every call.
template <int V>
__device__ __forceinline__ void warp_sums(float (&v)[V]) {
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "warp_sums takes a power of two up to 32 values");
  const int lane = static_cast<int>(threadIdx.x) % 32;
  keep_halves<0>(v, lane);
  float total = v[0];
#pragma unroll
  for (int offset = 16 >> kLog2<V>; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  if constexpr (V == 1) {
    v[0] = total;  // every lane has it already
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = __shfl_sync(0xffffffffu, total, k << (5 - kLog2<V>));
  }
}

// One row's split attention: what each partition of its keys leaves for the merge.
struct Partials {
  float* acc;          // [row, head, partition, head_dim]: weighted values, relative to the partition's max
  float* stats;        // [row, head, partition, 2]: the partition's max score (log2 units) and its weights' sum
  int64_t partitions;  // per (row, head)
};

// One warp's online softmax over its keys for the block's kHeads query heads (a power of two
// holding its heads_here): running max (log2 units), sum of weights and weighted values (a
// lane's columns: lane_column).
template <int kHeads, int kPerLane>
struct WarpSoftmax {
  float acc[kHeads][kPerLane], max_score[kHeads], sum[kHeads];
};

// A run of kKeys consecutive keys [first, first + kKeys) (those at or past `end` count as absent)
// added to the warp's softmax of every head: their rows' loads all issued before any is used,
// the kHeads x kKeys scores summed over the lanes together (warp_sums).
template <typename T, int kHeads, int kPerLane, int kKeys>
__device__ __forceinline__ void add_run(WarpSoftmax<kHeads, kPerLane>& w, const float (&qr)[kHeads][kPerLane],
                                        const T* __restrict__ k_pool, const T* __restrict__ v_pool,
                                        const BlockTable& table, int64_t kv_off, int64_t first, int64_t end,
                                        int heads_here, float scale, const PagedAttentionShape& s) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  float key[kKeys][kPerLane], value[kKeys][kPerLane];
#pragma unroll
  for (int u = 0; u < kKeys; ++u) {
    if (first + u < end) {  // the same for the whole warp
      const int64_t row = cache_row(table, static_cast<int32_t>(first + u), s) + kv_off;
      load_row(key[u], k_pool + row, lane, s.head_dim);
      load_row(value[u], v_pool + row, lane, s.head_dim);
    } else {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) key[u][j] = value[u][j] = 0.0f;
    }
  }
  float score[kHeads * kKeys];  // [head][key]: this lane's part of each dot, then the whole
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) dot = fmaf(qr[i][j], key[u][j], dot);
      score[i * kKeys + u] = dot;
    }
  }
  warp_sums(score);
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (i >= heads_here) break;  // the same for the whole block
    float grown = w.max_score[i];
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      score[i * kKeys + u] = first + u < end ? score[i * kKeys + u] * scale : -INFINITY;
      grown = fmaxf(grown, score[i * kKeys + u]);
    }
    // grown is finite (the run's first key is inside), so keep is 0 before the first key.
    const float keep = exp2f(w.max_score[i] - grown);
    w.sum[i] *= keep;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) w.acc[i][j] *= keep;
#pragma unroll
    for (int u = 0; u < kKeys; ++u) {
      const float weight = exp2f(score[i * kKeys + u] - grown);  // 0 past the end
      w.sum[i] += weight;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) w.acc[i][j] = fmaf(weight, value[u][j], w.acc[i][j]);
    }
    w.max_score[i] = grown;
  }
}

// Where a block's merged results go: the output rows of its heads (a row of one partition), or
// this partition's partials (a longer row's, merged by paged_attention_merge_kernel).
struct BlockResult {
  float* out;
  Partials partials;
  int64_t first_head_row;  // (row, first head of the block) as row * heads + head
  bool split;
};

// The warps' softmaxes merged through shared memory ([warps][heads_here][max, sum], then each
// head's [top, total], then [warps][heads_here][hd] weighted values) and written. A thread per
// head turns its warps' maxes into their factors once; a warp without keys here (under
// kPagedWarps runs in the partition) has max -inf and sum 0: its factor is 0.
template <int kHeads, int kPerLane>
__device__ __forceinline__ void merge_warps(const WarpSoftmax<kHeads, kPerLane>& w, int heads_here, int64_t hd,
                                            const BlockResult& result) {
  extern __shared__ float shared[];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  float* stats = shared;
  float* head = stats + 2 * kPagedWarps * heads_here;
  float* partial = head + 2 * heads_here;
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    if (i >= heads_here) break;
    if (lane == 0) {
      stats[2 * (warp * heads_here + i)] = w.max_score[i];
      stats[2 * (warp * heads_here + i) + 1] = w.sum[i];
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane_column<kPerLane>(lane, j);
      if (d < hd) partial[(warp * heads_here + i) * hd + d] = w.acc[i][j];
    }
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < heads_here) {
    const int i = static_cast<int>(threadIdx.x);
    float top = -INFINITY;
    for (int v = 0; v < kPagedWarps; ++v) top = fmaxf(top, stats[2 * (v * heads_here + i)]);
    float total = 0.0f;
    for (int v = 0; v < kPagedWarps; ++v) {
      const float factor = exp2f(stats[2 * (v * heads_here + i)] - top);
      total = fmaf(stats[2 * (v * heads_here + i) + 1], factor, total);
      stats[2 * (v * heads_here + i)] = factor;  // the max, read once, becomes its factor
    }
    head[2 * i] = top;
    head[2 * i + 1] = total;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < heads_here * hd; e += kPagedThreads) {
    const int64_t i = e / hd, d = e % hd;
    float o = 0.0f;
    for (int v = 0; v < kPagedWarps; ++v) {
      o = fmaf(partial[(v * heads_here + i) * hd + d], stats[2 * (v * heads_here + i)], o);
    }
    const int64_t head_row = result.first_head_row + i;
    if (!result.split) {
      result.out[head_row * hd + d] = o / head[2 * i + 1];
      continue;
    }
    const int64_t part = head_row * result.partials.partitions + blockIdx.y;
    result.partials.acc[part * hd + d] = o;
    if (d == 0) {
      result.partials.stats[2 * part] = head[2 * i];
      result.partials.stats[2 * part + 1] = head[2 * i + 1];
    }
  }
}

// Block (row, kv head, slice of its query heads) x partition of the keys: the keys
// [p * kPagedPartitionKeys, + kPagedPartitionKeys) of the row's [0, len). Each warp takes runs of
// kKeysInFlight consecutive keys, every kPagedWarps-th run, its lanes across head_dim (a key's
// and a value's row read whole, coalesced, once for all the query heads of the block), with an
// online softmax per head (running max, sum and weighted values, rescaled when the max grows);
// the warps' results are merged in shared memory. A row with one partition writes its output;
// a longer one writes its partition's partial (paged_attention_merge_kernel finishes it). The
// order of every sum depends on the row's length only, never on the batch it came in.
template <typename T, int kHeads, int kPerLane>
__global__ void __launch_bounds__(kPagedThreads)
    paged_attention_kernel(float* __restrict__ out, Partials partials, const float* __restrict__ q,
                           int64_t q_stride, const T* __restrict__ k_pool, const T* __restrict__ v_pool,
                           const int32_t* __restrict__ block_tables, const int32_t* __restrict__ sequences,
                           const int32_t* __restrict__ positions, int64_t past, int64_t slices,
                           PagedAttentionShape s) {
  constexpr int kKeys = kKeysInFlight<kPerLane>;
  const int64_t hd = s.head_dim, group = s.heads / s.kv_heads;
  const int64_t slice = blockIdx.x % slices, row_head = blockIdx.x / slices;
  const int64_t r = row_head / s.kv_heads, g = row_head % s.kv_heads;
  const int64_t h0 = g * group + slice * kGroupHeads;  // the block's first query head
  const int64_t heads_left = group - slice * kGroupHeads;
  const int heads_here = static_cast<int>(heads_left < kGroupHeads ? heads_left : kGroupHeads);
  // Paged rows carry their sequence and position; without tables, row r is position past + r.
  const BlockTable table(block_tables ? block_tables + static_cast<int64_t>(sequences[r]) * s.table_width : nullptr,
                         s.block_size);
  const int64_t len = (block_tables ? static_cast<int64_t>(positions[r]) : past + r) + 1;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * kPagedPartitionKeys;
  if (begin >= len) return;  // the row is shorter than this partition (the whole block leaves)
  const int64_t end = len < begin + kPagedPartitionKeys ? len : begin + kPagedPartitionKeys;
  const float scale = kLog2e / sqrtf(static_cast<float>(hd));
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  float qr[kHeads][kPerLane];
  WarpSoftmax<kHeads, kPerLane> w;
#pragma unroll
  for (int i = 0; i < kHeads; ++i) {
    w.max_score[i] = -INFINITY;
    w.sum[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t d = lane_column<kPerLane>(lane, j);
      qr[i][j] = i < heads_here && d < hd ? q[r * q_stride + (h0 + i) * hd + d] : 0.0f;
      w.acc[i][j] = 0.0f;
    }
  }
  for (int64_t first = begin + static_cast<int64_t>(warp) * kKeys; first < end; first += kPagedWarps * kKeys)
    add_run<T, kHeads, kPerLane, kKeys>(w, qr, k_pool, v_pool, table, g * hd, first, end, heads_here, scale, s);
  merge_warps(w, heads_here, hd, BlockResult{out, partials, r * s.heads + h0, len > kPagedPartitionKeys});
}

// Block (row, head) of a row longer than one partition: its partitions' partials merged in
// partition order, each rescaled to the largest max. The factors are computed once each, a chunk
// of kPagedThreads partitions at a time, into shared memory.
__global__ void __launch_bounds__(kPagedThreads)
    paged_attention_merge_kernel(float* __restrict__ out, Partials partials, const int32_t* __restrict__ positions,
                                 int64_t past, PagedAttentionShape s) {
  constexpr int kColumns = kMaxHeadDim / kPagedThreads;  // output columns per thread at most
  __shared__ float factor[kPagedThreads];
  const int64_t r = blockIdx.x / s.heads, hd = s.head_dim;
  const int64_t len = (positions ? static_cast<int64_t>(positions[r]) : past + r) + 1;
  if (len <= kPagedPartitionKeys) return;  // written whole by its one partition
  const int64_t count = (len + kPagedPartitionKeys - 1) / kPagedPartitionKeys;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * partials.partitions;  // (row, head)'s first partial
  const float* stats = partials.stats + 2 * first;
  float top = -INFINITY;
  for (int64_t p = 0; p < count; ++p) top = fmaxf(top, stats[2 * p]);
  float total = 0.0f, o[kColumns] = {};
  for (int64_t chunk = 0; chunk < count; chunk += kPagedThreads) {
    const int64_t n = count - chunk < kPagedThreads ? count - chunk : kPagedThreads;
    __syncthreads();  // the previous chunk's factors are read
    if (threadIdx.x < n) factor[threadIdx.x] = exp2f(stats[2 * (chunk + threadIdx.x)] - top);
    __syncthreads();
    for (int64_t p = 0; p < n; ++p) {
      total = fmaf(stats[2 * (chunk + p) + 1], factor[p], total);
#pragma unroll
      for (int k = 0; k < kColumns; ++k) {
        const int64_t d = threadIdx.x + k * kPagedThreads;
        if (d < hd) o[k] = fmaf(partials.acc[(first + chunk + p) * hd + d], factor[p], o[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kColumns; ++k) {
    const int64_t d = threadIdx.x + k * kPagedThreads;
    if (d < hd) out[blockIdx.x * hd + d] = o[k] / total;
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
    const int64_t row =
        cache_row(BlockTable(block_tables + static_cast<int64_t>(sequences[r]) * s.table_width, s.block_size),
                  positions[r], s);
    k_pool[row + c] = narrow<T>(k[r * stride + c]);
    v_pool[row + c] = narrow<T>(v[r * stride + c]);
  }
}

// The attention kernel for the pools' elements, heads per block and head_dim class (kPerLane:
// head_dim up to 32 kPerLane columns, lane_column's).
template <typename T>
void launch_partitions(dim3 grid, size_t bytes, cudaStream_t stream, float* out, const Partials& partials,
                       const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t past,
                       int64_t slices, const PagedAttentionShape& s) {
  const auto* k = static_cast<const T*>(k_pool);
  const auto* v = static_cast<const T*>(v_pool);
  const auto run = [&](auto kernel) {
    kernel<<<grid, kPagedThreads, bytes, stream>>>(out, partials, q, q_stride, k, v, block_tables, sequences,
                                                   positions, past, slices, s);
  };
  // Heads per block: the group's (or 8 of a larger group's), rounded up to a power of two.
  const int64_t block_heads = std::min<int64_t>(s.heads / s.kv_heads, kGroupHeads);
  const auto for_head_dim = [&](auto heads) {
    constexpr int kHeads = decltype(heads)::value;
    if (s.head_dim <= 32) run(paged_attention_kernel<T, kHeads, 1>);
    else if (s.head_dim <= 64) run(paged_attention_kernel<T, kHeads, 2>);
    else if (s.head_dim <= 128) run(paged_attention_kernel<T, kHeads, 4>);
    else run(paged_attention_kernel<T, kHeads, 8>);
  };
  if (block_heads == 1) for_head_dim(std::integral_constant<int, 1>{});
  else if (block_heads == 2) for_head_dim(std::integral_constant<int, 2>{});
  else if (block_heads <= 4) for_head_dim(std::integral_constant<int, 4>{});
  else for_head_dim(std::integral_constant<int, 8>{});
  check_launch("paged_attention_kernel");
}

// `longest`: a bound on the rows' lengths (the tables' positions, or past + rows), which sets the
// partitions per row. Rows are launched in slices whose partials fit kPagedPartialBytes.
void launch_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                      const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t past,
                      int64_t rows, int64_t longest, const PagedAttentionShape& s, cudaStream_t stream) {
  if (rows == 0) return;
  LOOM_CHECK(s.head_dim >= 1 && s.head_dim <= kMaxHeadDim, "cuda::paged_attention: head_dim " +
                                                                std::to_string(s.head_dim) + " is outside [1, " +
                                                                std::to_string(kMaxHeadDim) + "]");
  const int64_t partitions = std::max<int64_t>(1, (longest + kPagedPartitionKeys - 1) / kPagedPartitionKeys);
  LOOM_CHECK(partitions <= 65535, "cuda::paged_attention: sequences of " + std::to_string(longest) +
                                      " positions need more than 65535 partitions of " +
                                      std::to_string(kPagedPartitionKeys) + " keys");
  const int64_t group = s.heads / s.kv_heads, slices = (group + kGroupHeads - 1) / kGroupHeads;
  const int64_t block_heads = std::min<int64_t>(group, kGroupHeads);
  const int64_t shared_floats = kPagedWarps * block_heads * (s.head_dim + 2) + 2 * block_heads;
  const size_t bytes = static_cast<size_t>(shared_floats) * sizeof(float);
  const int64_t per_row = s.heads * partitions * (s.head_dim + 2) * static_cast<int64_t>(sizeof(float));
  // Both grids fit: the attention's n * kv_heads * slices blocks and the merge's n * heads.
  const int64_t grid_rows = std::max<int64_t>(1, std::numeric_limits<int32_t>::max() / s.heads);
  const int64_t fits = partitions > 1 ? std::max<int64_t>(1, kPagedPartialBytes / per_row) : rows;
  const int64_t step = std::min(fits, grid_rows);
  std::optional<Scratch> scratch;  // only for split rows (a decoding step of short rows takes none)
  Partials partials{nullptr, nullptr, partitions};
  if (partitions > 1) {
    const int64_t held = std::min(rows, step) * s.heads * partitions;
    scratch.emplace();
    partials.acc = scratch->floats(held * s.head_dim);
    partials.stats = scratch->floats(2 * held);
  }
  for (int64_t first = 0; first < rows; first += step) {
    const int64_t n = std::min(step, rows - first);
    float* out_here = out + first * s.heads * s.head_dim;
    const float* q_here = q + first * q_stride;
    const int32_t* sequences_here = sequences ? sequences + first : nullptr;
    const int32_t* positions_here = positions ? positions + first : nullptr;
    const dim3 grid(static_cast<unsigned>(n * s.kv_heads * slices), static_cast<unsigned>(partitions));
    if (s.cache == KvCacheDtype::Bf16) {
      launch_partitions<__nv_bfloat16>(grid, bytes, stream, out_here, partials, q_here, q_stride, k_pool, v_pool,
                                       block_tables, sequences_here, positions_here, past + first, slices, s);
    } else {
      launch_partitions<float>(grid, bytes, stream, out_here, partials, q_here, q_stride, k_pool, v_pool,
                               block_tables, sequences_here, positions_here, past + first, slices, s);
    }
    if (partitions == 1) continue;
    paged_attention_merge_kernel<<<static_cast<unsigned>(n * s.heads), kPagedThreads, 0, stream>>>(
        out_here, partials, positions_here, past + first, s);
    check_launch("paged_attention_merge_kernel");
  }
}

}  // namespace

void paged_attention(float* out, const float* q, int64_t q_stride, const void* k_pool, const void* v_pool,
                     const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                     const PagedAttentionShape& s, cudaStream_t stream) {
  launch_attention(out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, 0, rows,
                   s.table_width * s.block_size, s, stream);
}

void attention_decode(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                      int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      cudaStream_t stream) {
  const PagedAttentionShape s{heads, kv_heads, head_dim, 1, 0};
  launch_attention(out, q, q_stride, k_cache, v_cache, nullptr, nullptr, nullptr, past, new_tokens,
                   past + new_tokens, s, stream);
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
