#pragma once
// The per-tensor amax (max |x|, NaN winning) on the device: a running max per thread, reduced per
// warp and per block, then one atomic per block into a device float whose bits order as unsigned
// (a non-negative float or NaN, whose bits exceed Inf's). Used by the amax pass of the FP8 casts,
// by kernels that take the amax of what they write (kernels::activation_forward_bf16's), and by
// the casts that take their operand's amax as they read it (fp8_delayed: tiled_cast.cuh, cast.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

// max that lets a NaN through, as precision's amax.
__device__ inline float nan_max(float running, float value) {
  return (value > running || value != value) ? value : running;
}
__device__ inline float warp_nan_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// *amax = nan_max(*amax, the block's running maxes `m`), *amax's sign bit clear (+0, a positive
// value or NaN: -0 would order above every float as unsigned): every thread of the block calls it (a
// __syncthreads inside), after its last store; a block of 1-3 dimensions whose thread count is a
// multiple of 32, at most 1024 (warps are runs of 32 in the linear thread index, x fastest).
__device__ inline void block_amax_into(unsigned* amax, float m) {
  __shared__ float warps[32];
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  m = warp_nan_max(m);
  if (thread % 32 == 0) warps[thread / 32] = m;
  __syncthreads();
  if (thread == 0) {
    float b = warps[0];
    for (unsigned w = 1; w < threads / 32; ++w) b = nan_max(b, warps[w]);
    atomicMax(amax, __float_as_uint(b));
  }
}

// Blocks for a grid-stride reduction into one word: about two resident waves of kThreads-thread
// blocks on a large GPU, so the atomics on that one address number a thousand or two however large
// the tensor (an atomic per warp over 65536 blocks would serialise half a million of them).
constexpr int64_t kAmaxBlocks = 1024;
inline unsigned amax_grid(int64_t n) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kAmaxBlocks)));
}

// A launch over rows (launch_over_rows, grid-stride over them) whose blocks each take one atomic
// into `amax` (when not null): its rows capped so the blocks number about two resident waves, as
// amax_grid's (each block then walks several rows).
inline RowsLaunch amax_capped(RowsLaunch l, const float* amax) {
  if (amax == nullptr) return l;
  l.grid.y = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(l.grid.y, 2 * kAmaxBlocks / l.grid.x)));
  return l;
}

}  // namespace loom::kernels::cuda
