#pragma once
// A tensor [rows, cols] cast element by element into its transposed layout [cols, rows] and, when
// `plain` is set, into its own layout too, from one evaluation of each element, through 32 x 32
// tiles in shared memory so both the reads and the writes are coalesced (device code). value(r, c)
// gives element [r, c] in fp32: a load (cast.cu), or an MLP activation computed from what it reads
// (activation_codes.cu). Caster<To> is one element's cast (the FP8 ones multiply by the scale in
// device memory first and write an Inf or NaN as FP8's NaN: fp8_gemm_code). With `amax` (not
// null) the cast also takes max |value| of what it reads into that device float (amax.cuh: NaN
// wins), so no amax pass reads the tensor first (fp8_delayed, whose scale is known beforehand).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/cast.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/fp8_format.cuh"

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
  __device__ Out operator()(float x) const {
    if constexpr (kTo == CastTo::F32) {
      return x;
    } else if constexpr (kTo == CastTo::BF16) {
      return __float2bfloat16_rn(x);
    } else if constexpr (kTo == CastTo::F16) {
      return __float2half_rn(x);
    } else {
      return fp8_gemm_code(x, *scale, kTo == CastTo::E4M3 ? Fp8::E4M3 : Fp8::E5M2);
    }
  }
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

// Blocks of a tiled cast taking an amax: about two resident waves, as amax_grid's.
constexpr int64_t kTiledAmaxBlocks = 2 * kAmaxBlocks;

// out [cols, rows] (and plain [rows, cols], may be null) from value over [rows, cols]; amax (a
// device float, may be null) takes max |value|.
template <typename Value, typename Out, typename Cast>
void launch_tiled_cast(Value value, Out* out, Out* plain, int64_t rows, int64_t cols, Cast cast, cudaStream_t stream,
                       const char* what, float* amax = nullptr) {
  const int64_t tiles_x = (cols + kCastTile - 1) / kCastTile, tiles_y = (rows + kCastTile - 1) / kCastTile;
  LOOM_CHECK(tiles_x < (int64_t{1} << 31),
             std::string(what) + ": " + std::to_string(rows) + " x " + std::to_string(cols) +
                 " has too many columns to transpose");
  // Rows of blocks rounded up, so a wide tensor (tiles_x near a resident wave) still gets two waves.
  const int64_t cap = amax != nullptr ? (kTiledAmaxBlocks + tiles_x - 1) / tiles_x : 65535;
  const int64_t grid_y = std::max<int64_t>(1, std::min(tiles_y, cap));
  tiled_cast_kernel<<<dim3(static_cast<unsigned>(tiles_x), static_cast<unsigned>(grid_y)), dim3(kCastTile, 8), 0,
                      stream>>>(value, out, plain, rows, cols, cast, reinterpret_cast<unsigned*>(amax));
  check_launch(what);
}

}  // namespace loom::kernels::cuda
