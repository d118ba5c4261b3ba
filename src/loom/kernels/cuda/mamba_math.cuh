#pragma once
// The scalar functions of the Mamba-2 kernels (causal_conv.cu, ssd_scan.cu, gated_norm.cu), in
// double as the CPU kernels compute them, and a warp's double sum (device code only).
#include <cuda_runtime.h>

namespace loom::kernels::cuda {

__device__ inline double sigmoid_of(double v) { return 1.0 / (1.0 + exp(-v)); }
__device__ inline double softplus_of(double v) { return v > 20.0 ? v : log1p(exp(v)); }

// The sum over the warp's 32 lanes (every lane gets it; a fixed tree, so deterministic).
__device__ inline double warp_sum_double(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace loom::kernels::cuda
