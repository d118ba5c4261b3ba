#pragma once
// A tensor [rows, cols] cast element by element into its transposed layout [cols, rows] and, when
// `plain` is set, into its own layout too, from one evaluation of each element, through tiles in
// shared memory so both the reads and the writes are coalesced (device code). value(r, c) gives
// element [r, c] in fp32: a load (cast.cu), or an MLP activation computed from what it reads
// (activation_codes.cu). Caster<To> is one element's cast (the FP8 ones multiply by the scale in
// device memory first and write an Inf or NaN as FP8's NaN: fp8_gemm_code). With `amax` (not
// null) the cast also takes max |value| of what it reads into that device float (amax.cuh: NaN
// wins), so no amax pass reads the tensor first (fp8_delayed, whose scale is known beforehand).
//
// Two kernels, the same codes: a packed one (64 x 64 tiles, or 128 x 64 for 1-byte codes as
// tiled_cast_rows() says (cast.h), four columns per load and four codes per store: pack4.cuh) where
// rows, cols and the pointers allow it, and 32 x 32 tiles one element at a time for the rest. For
// the packed one the functor also has value.read4(r, c), the loads of elements [r, c .. c + 3]
// (c a multiple of 4) as a `Reads`, value.value4(reads, v) setting v[k] to exactly value(r, c + k)
// from them (the same loads and arithmetic, so the same bits), and value.packs4(), a host method:
// whether its pointers and widths allow those packed reads.
//
// A functor may declare `static constexpr int kParts = 2`: its columns are then two parts of
// w = cols / 2 each whose elements at columns c and w + c come from the same loads (SwiGLU's
// gradient: gate and up columns both from the gate, up and output gradient at c). read4(r, c)
// takes c < w and value4(reads, v) sets v[p][k] to value(r, p * w + c + k), so a block of the
// packed kernel casts the tiles at columns c0 and w + c0 from one set of loads, not each twice.
//
// A functor may declare `static constexpr bool kUpdates = true`: evaluating an element writes
// memory (AdamW's update, adamw.cu), so it must be evaluated exactly once. The packed kernel then
// runs only where its 64 x 64 tiles cover the tensor exactly (it reads clamped duplicates past the
// edges otherwise, and 128-row tiles cap its registers below what the update's loads take); the
// scalar kernel evaluates each element once anyway.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "loom/core/error.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/fp8_format.cuh"
#include "loom/kernels/cuda/pack4.cuh"

namespace loom::kernels::cuda {

constexpr int kCastTile = 32;

// The element a cast to kTo writes, named for host code too: a __device__ function's deduced
// return type is void there, so a host launch taking its output type from one launches no kernel
// (cudaErrorInvalidDeviceFunction).
template <CastTo kTo>
struct CastOutput {
  using type = uint8_t;  // FP8 codes
};
template <>
struct CastOutput<CastTo::F32> {
  using type = float;
};
template <>
struct CastOutput<CastTo::BF16> {
  using type = __nv_bfloat16;
};
template <>
struct CastOutput<CastTo::F16> {
  using type = __half;
};

template <CastTo kTo>
struct Caster {
  using Out = typename CastOutput<kTo>::type;
  const float* scale;
  // The scale as the FP8 casts read it (1: the others take none), and the cast given it, so a
  // kernel may read it once rather than after each byte store (which may alias it).
  __device__ float scale_value() const {
    if constexpr (kTo == CastTo::E4M3 || kTo == CastTo::E5M2) {
      return *scale;
    } else {
      return 1.0f;
    }
  }
  __device__ Out operator()(float x, float s) const {
    if constexpr (kTo == CastTo::F32) {
      return x;
    } else if constexpr (kTo == CastTo::BF16) {
      return __float2bfloat16_rn(x);
    } else if constexpr (kTo == CastTo::F16) {
      return __float2half_rn(x);
    } else {
      return fp8_gemm_code(x, s, kTo == CastTo::E4M3 ? Fp8::E4M3 : Fp8::E5M2);
    }
  }
  __device__ Out operator()(float x) const { return (*this)(x, scale_value()); }
};

// A block walks a column of tiles (block rows of the grid stride down the tiles), so a capped grid
// covers any number of rows and an amax costs one atomic per block, not per tile.
template <typename Value, typename Out, typename Cast>
__global__ void tiled_cast_kernel(Value value, Out* __restrict__ out, Out* __restrict__ plain, int64_t rows,
                                  int64_t cols, Cast cast, unsigned* amax) {
  __shared__ float tile[kCastTile][kCastTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kCastTile;
  float m = 0.0f;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kCastTile; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kCastTile) {
    for (int i = threadIdx.y; i < kCastTile; i += blockDim.y) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const float v = value(r, c);
        tile[i][threadIdx.x] = v;
        m = nan_max(m, fabsf(v));
        if (plain != nullptr) plain[r * cols + c] = cast(v);
      }
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kCastTile; i += blockDim.y) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (c < cols && r < rows) out[c * rows + r] = cast(tile[threadIdx.x][i]);
    }
    __syncthreads();  // the next tile overwrites this one
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// Stores a at p (global memory, pack-aligned) as one access with the default cache policy (.wb):
// in the tile loops the compiler splits a plain copy of the struct into a store per element.
template <typename T>
__device__ inline void store_pack(T* p, const Pack4<T>& a) {
  using Word = std::conditional_t<sizeof(T) == 1, unsigned, std::conditional_t<sizeof(T) == 2, uint2, uint4>>;
  static_assert(sizeof(Word) == sizeof(Pack4<T>));
  Word w;
  memcpy(&w, &a, sizeof w);
  __stwb(reinterpret_cast<Word*>(p), w);
}

// Stores a at p in shared memory: one 4-byte store for 1-byte codes (p 4-byte aligned, the tile's
// stride being 68), else element by element (a wider tile row's stride leaves p unaligned).
template <typename T>
__device__ inline void store_shared_pack(T* p, const Pack4<T>& a) {
  if constexpr (sizeof(T) == 1) {
    unsigned word;
    memcpy(&word, &a, sizeof word);
    *reinterpret_cast<unsigned*>(p) = word;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = a.v[k];
  }
}

// The parts of a value (its kParts, else 1: the file's header).
template <typename Value, typename = void>
struct PartsOf : std::integral_constant<int, 1> {};
template <typename Value>
struct PartsOf<Value, std::void_t<decltype(Value::kParts)>> : std::integral_constant<int, Value::kParts> {};
template <typename Value>
constexpr int kPartsOf = PartsOf<Value>::value;

// Whether a value updates memory as it is evaluated (its kUpdates, else false: the file's header).
template <typename Value, typename = void>
struct UpdatesOf : std::false_type {};
template <typename Value>
struct UpdatesOf<Value, std::void_t<decltype(Value::kUpdates)>> : std::bool_constant<Value::kUpdates> {};

// The packed kernel's tiles: kRows x 64 elements to 4 kRows threads, each taking four consecutive
// columns of four rows (16 elements) per tile. kRows: 64, or for 1-byte codes 128 where
// tiled_cast_rows() says so (cast.h).
constexpr int kPackedTile = 64;  // a tile's columns, and its rows unless 128 are asked for

// Elements per row of the packed kernel's tile in shared memory: 64 and one 4-byte word, an odd
// number of words (17 for 1-byte codes), so rows 16 apart start 16 banks apart, rows 4 apart 4.
template <typename Out>
constexpr int kPackedTileStride = kPackedTile + 4 / static_cast<int>(sizeof(Out));

// First pass: the tile row of a thread's s-th four columns (4 (lane % 16) .. + 3), s < 4. A warp's
// half-warps are 16 rows apart, so their 4-byte code stores fall in distinct banks (16 times an odd
// stride: 16 banks on). 8 warps: rows warp + 8 a + 16 h + 32 b; 16 warps: warp + 16 h + 32 s.
template <int kRows>
__device__ inline int packed_row(int warp, int lane, int s) {
  if constexpr (kRows == 64) {
    return warp + 16 * (lane / 16) + 8 * (s % 2) + 32 * (s / 2);
  } else {
    return warp + 16 * (lane / 16) + 32 * s;
  }
}

// Where tile row r keeps its columns 4 g .. 4 g + 3 (in units of 4 elements): at g, or in a 128-row
// tile rotated by r / 32 (mod 16). The 128-row transposed pass reads a word from each of 32 rows 4
// apart (4 x 17 words: every 8th lane on the same bank, a 4-way conflict unrotated); rotated by
// lane / 8 they fall in 32 distinct banks, and a first-pass row's 16 groups still in 16.
template <int kRows>
__device__ inline int packed_group_at(int r, int g) {
  return kRows == 128 ? (g + r / 32) % 16 : g;
}

// The second pass: a part's tile (after the barrier) into that part's out [width, rows], tile
// column j at out row c0 + j, tile row i at its column r0 + i, four rows per pack stored.
// 64 rows: tile rows 4 q .. 4 q + 3 of columns column(s), s < 4, read element by element (a
// warp's access: 8 groups of 4 rows by 4 columns, 8 or more distinct banks); a warp's store of a
// column of 1-byte codes is 32 bytes, the next warp's its other 32. 128 rows (1-byte codes): rows
// 4 lane .. 4 lane + 3 of columns 4 warp .. 4 warp + 3, read as four words (packed_group_at) and
// transposed in registers, so each store of a warp is 128 contiguous bytes of one row of out.
template <int kRows, typename Out>
__device__ inline void store_transposed(const Out* tile, Out* out, int64_t rows, int64_t width, int64_t c0,
                                        int64_t r0, int warp, int lane) {
  constexpr int kStride = kPackedTileStride<Out>;
  if constexpr (kRows == 64) {
    const int q = lane % 8 + 8 * (warp % 2);
    auto column = [&](int s) { return lane / 8 + 4 * (warp / 2) + 16 * s; };
    Pack4<Out> transposed[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int k = 0; k < 4; ++k) transposed[s].v[k] = tile[(4 * q + k) * kStride + column(s)];
    }
    const int64_t r = r0 + 4 * q;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int64_t oc = c0 + column(s);
      if (oc < width && r < rows) store_pack(out + oc * rows + r, transposed[s]);
    }
  } else {
    static_assert(sizeof(Out) == 1, "128-row tiles hold 1-byte codes");
    unsigned word[4];  // word k: tile row 4 lane + k, its byte j column 4 warp + j
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = 4 * lane + k;
      word[k] = *reinterpret_cast<const unsigned*>(tile + i * kStride + 4 * packed_group_at<kRows>(i, warp));
    }
    // Column j's pack: byte j of each word, in order. First bytes 0, 1 (low) and 2, 3 (high) of
    // words 0 and 1 interleaved (likewise 2 and 3), then the halves of those paired.
    const unsigned low01 = __byte_perm(word[0], word[1], 0x5140), high01 = __byte_perm(word[0], word[1], 0x7362);
    const unsigned low23 = __byte_perm(word[2], word[3], 0x5140), high23 = __byte_perm(word[2], word[3], 0x7362);
    const unsigned column[4] = {__byte_perm(low01, low23, 0x5410), __byte_perm(low01, low23, 0x7632),
                                __byte_perm(high01, high23, 0x5410), __byte_perm(high01, high23, 0x7632)};
    // Columns oc .. oc + 3 all in or all out: width is a multiple of 4.
    const int64_t r = r0 + 4 * lane, oc = c0 + 4 * warp;
    if (oc < width && r < rows) {
      Out* at = out + oc * rows + r;
#pragma unroll
      for (int j = 0; j < 4; ++j) __stwb(reinterpret_cast<unsigned*>(at + j * rows), column[j]);
    }
  }
}

// Blocks of the packed kernel an SM holds at least (its registers capped to allow them): two of
// 128-row tiles (512 threads, at most 64 registers each), so one block's loads overlap the other's
// barrier and transposed stores; 0 for 64-row tiles, no minimum (up to 255 registers: three or more
// 256-thread blocks fit anyway).
template <int kRows>
constexpr int kPackedMinBlocks = kRows == 128 ? 2 : 0;

// tiled_cast_kernel over kRows x 64 tiles for rows and cols multiples of 4, out and plain
// pack-aligned and value's reads packable (value.packs4()). A thread issues all the loads of its 16
// elements (value.read4 of four rows) before any arithmetic or store: a byte store may alias them,
// so the compiler would not hoist a later load above it, nor ptxas above the branches of the
// arithmetic. It then casts each element once, stores four codes of a row as one pack to plain and
// to the tile, and after the barrier four codes of a column (4 consecutive rows) as one pack to out
// (store_transposed). Rows and columns past the end are read clamped to the last ones (no branch
// among the loads), and neither stored nor maxed. Two tiles in shared memory alternate, so one
// barrier per tile suffices: a thread writes a buffer again only after the next tile's barrier,
// which every thread reaches after its reads of it. A value of two parts has a tile per part in
// each buffer: the block's grid column covers columns c0 .. c0 + 63 of each part, whose 16
// elements per thread come from the same loads, and its threads store both parts' codes as they
// would one's.
template <int kRows, typename Value, typename Out, typename Cast>
__global__ void __launch_bounds__(4 * kRows, kPackedMinBlocks<kRows>)
    tiled_cast4_kernel(Value value, Out* __restrict__ out, Out* __restrict__ plain, int64_t rows, int64_t cols,
                       Cast cast, unsigned* amax) {
  constexpr int kParts = kPartsOf<Value>, kStride = kPackedTileStride<Out>, kTileSize = kRows * kStride;
  // Two parts' 4 tiles of 1-byte codes take 17 KB (35 KB of 128 rows), under the 48 KB of static
  // shared memory, which 128 rows of wider elements would exceed.
  static_assert(kParts == 1 || (kParts == 2 && sizeof(Out) == 1), "two parts cast to 1-byte codes only");
  static_assert(kRows == 64 || (kRows == 128 && sizeof(Out) == 1), "128-row tiles of 1-byte codes only");
  __shared__ __align__(16) unsigned char bytes[2 * kParts * kTileSize * sizeof(Out)];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // First pass: columns 4 x .. 4 x + 3 of tile rows row(s), s < 4.
  const int x = lane % 16;
  auto row = [&](int s) { return packed_row<kRows>(warp, lane, s); };
  const int64_t width = cols / kParts;  // of a part: part p's column c is the tensor's p * width + c
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kPackedTile, c = c0 + 4 * x;
  const bool column_in = c < width;
  const int64_t c_read = column_in ? c : width - 4;
  const float scale = cast.scale_value();  // nothing this kernel stores is the scale
  float m = 0.0f;
  int buffer = 0;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRows; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kRows, buffer ^= 1) {
    Out* tiles = reinterpret_cast<Out*>(bytes) + buffer * kParts * kTileSize;  // part p's at p * kTileSize
    typename Value::Reads read[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int64_t r = r0 + row(s);
      read[s] = value.read4(r < rows ? r : rows - 1, c_read);
    }
    Pack4<Out> codes[4][kParts];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      float v[kParts][4];
      if constexpr (kParts == 1) {
        value.value4(read[s], v[0]);
      } else {
        value.value4(read[s], v);
      }
      const bool in = column_in && r0 + row(s) < rows;
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          if (in) m = nan_max(m, fabsf(v[p][k]));
          codes[s][p].v[k] = cast(v[p][k], scale);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int64_t r = r0 + row(s);
      Out* at = tiles + row(s) * kStride + 4 * packed_group_at<kRows>(row(s), x);
#pragma unroll
      for (int p = 0; p < kParts; ++p) {
        if (plain != nullptr && column_in && r < rows) store_pack(plain + r * cols + p * width + c, codes[s][p]);
        store_shared_pack(at + p * kTileSize, codes[s][p]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      store_transposed<kRows>(tiles + p * kTileSize, out + p * width * rows, rows, width, c0, r0, warp, lane);
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// Blocks of a tiled cast taking an amax: about two resident waves of kTiledAmaxThreads-thread
// blocks (the scalar kernel's, the 64-row packed one's), as amax_grid's; half as many 512-thread
// blocks of 128-row tiles (the same threads). The grid's rows of blocks stride over the rest.
constexpr int64_t kTiledAmaxBlocks = 2 * kAmaxBlocks;
constexpr int kTiledAmaxThreads = 256;

// out [cols, rows] (and plain [rows, cols], may be null) from value over [rows, cols]; amax (a
// device float, may be null) takes max |value|. The packed kernel where the shape and pointers
// allow it (a row of 4 codes never leaves the tensor nor a part, each pack is aligned), else the
// scalar one. A block of the packed kernel covers a tile of each part of a value of parts; its
// tiles have 64 rows, or 128 for 1-byte codes when tiled_cast_rows() (cast.h) says so.
template <typename Value, typename Out, typename Cast>
void launch_tiled_cast(Value value, Out* out, Out* plain, int64_t rows, int64_t cols, Cast cast, cudaStream_t stream,
                       const char* what, float* amax = nullptr) {
  constexpr int kParts = kPartsOf<Value>;
  LOOM_CHECK(cols % kParts == 0, std::string(what) + ": " + std::to_string(cols) + " columns in " +
                                     std::to_string(kParts) + " equal parts");
  const int64_t width = cols / kParts;  // of a part
  constexpr bool kUpdates = UpdatesOf<Value>::value;
  const bool exact = !kUpdates || (rows % kPackedTile == 0 && width % kPackedTile == 0);
  const bool packed = rows % 4 == 0 && width % 4 == 0 && exact && value.packs4() && pack4_aligned<Out>(out) &&
                      (plain == nullptr || pack4_aligned<Out>(plain));
  const int tile_rows = !packed ? kCastTile : sizeof(Out) == 1 && !kUpdates ? tiled_cast_rows() : kPackedTile;
  const int64_t tile_cols = packed ? kPackedTile : kCastTile, threads = packed ? 4 * tile_rows : kCastTile * 8;
  const int64_t tiles_x = ((packed ? width : cols) + tile_cols - 1) / tile_cols;
  const int64_t tiles_y = (rows + tile_rows - 1) / tile_rows;
  LOOM_CHECK(tiles_x < (int64_t{1} << 31),
             std::string(what) + ": " + std::to_string(rows) + " x " + std::to_string(cols) +
                 " has too many columns to transpose");
  // Rows of blocks rounded up, so a wide tensor (tiles_x near a resident wave) still gets two waves.
  const int64_t amax_blocks = kTiledAmaxBlocks * kTiledAmaxThreads / threads;
  const int64_t cap = amax != nullptr ? (amax_blocks + tiles_x - 1) / tiles_x : 65535;
  const int64_t grid_y = std::max<int64_t>(1, std::min(tiles_y, cap));
  const dim3 grid(static_cast<unsigned>(tiles_x), static_cast<unsigned>(grid_y));
  auto* amax_word = reinterpret_cast<unsigned*>(amax);
  if (!packed) {
    tiled_cast_kernel<<<grid, dim3(kCastTile, 8), 0, stream>>>(value, out, plain, rows, cols, cast, amax_word);
  } else if (tile_rows == 128) {  // 1-byte codes of values that update nothing only (tile_rows above)
    if constexpr (sizeof(Out) == 1 && !kUpdates) {
      tiled_cast4_kernel<128, Value, Out, Cast><<<grid, 512, 0, stream>>>(value, out, plain, rows, cols, cast,
                                                                           amax_word);
    }
  } else {
    tiled_cast4_kernel<64, Value, Out, Cast><<<grid, 256, 0, stream>>>(value, out, plain, rows, cols, cast, amax_word);
  }
  check_launch(what);
}

}  // namespace loom::kernels::cuda
