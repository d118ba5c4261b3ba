#include "loom/kernels/cuda/norm_codes.h"

#include <algorithm>

#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/norm_math.cuh"
#include "loom/kernels/cuda/produced_codes.cuh"

namespace loom::kernels::cuda {

namespace {

// Rows walked by a capped grid, so an amax costs one atomic per block, not per row.
constexpr int64_t kStatisticsBlocks = 2 * kAmaxBlocks;

// Each row's statistics, as the forward kernels compute them; with `amax`, max |output| too.
template <bool kLayer>
__global__ void norm_statistics_kernel(float* mean, float* rstd, const float* in, const float* weight,
                                       const float* bias, int64_t rows, int64_t dim, float eps, unsigned* amax) {
  __shared__ float shared[kThreads];
  float m = 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = in + r * dim;
    if constexpr (kLayer) {
      const LayerRowStats stats = layer_row_stats(x, dim, eps, shared);
      if (threadIdx.x == 0) {
        mean[r] = stats.mean;
        rstd[r] = stats.rstd;
      }
      if (amax != nullptr) {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
          m = nan_max(m, fabsf(layer_value(x[i], stats.mean, stats.rstd, weight[i], bias[i])));
      }
    } else {
      const float s = rms_row_rstd(x, dim, eps, shared);
      if (threadIdx.x == 0) rstd[r] = s;
      if (amax != nullptr) {
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) m = nan_max(m, fabsf(rms_value(x[i], s, weight[i])));
      }
    }
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// The norm's output at (r, c).
struct RmsAt {
  const float *in, *weight, *rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const { return rms_value(in[r * dim + c], rstd[r], weight[c]); }
};
struct LayerAt {
  const float *in, *weight, *bias, *mean, *rstd;
  int64_t dim;
  __device__ float operator()(int64_t r, int64_t c) const {
    return layer_value(in[r * dim + c], mean[r], rstd[r], weight[c], bias[c]);
  }
};

}  // namespace

void norm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias, int64_t rows,
                     int64_t dim, float eps, float* amax, cudaStream_t stream) {
  if (rows == 0) return;
  const unsigned grid = static_cast<unsigned>(std::min(rows, kStatisticsBlocks));
  auto* amax_bits = reinterpret_cast<unsigned*>(amax);
  if (mean != nullptr) {
    norm_statistics_kernel<true><<<grid, kThreads, 0, stream>>>(mean, rstd, in, weight, bias, rows, dim, eps, amax_bits);
  } else {
    norm_statistics_kernel<false><<<grid, kThreads, 0, stream>>>(mean, rstd, in, weight, bias, rows, dim, eps,
                                                                 amax_bits);
  }
  check_launch("norm_statistics_kernel");
}

void norm_forward_codes(const float* in, const float* weight, const float* bias, const float* mean, const float* rstd,
                        int64_t rows, int64_t dim, const CastOperand& cast, void* codes, void* transposed,
                        cudaStream_t stream) {
  const char* what = "norm_forward_codes";
  if (mean != nullptr) {
    write_produced_codes(LayerAt{in, weight, bias, mean, rstd, dim}, cast, codes, transposed, rows, dim, stream, what);
  } else {
    write_produced_codes(RmsAt{in, weight, rstd, dim}, cast, codes, transposed, rows, dim, stream, what);
  }
}

}  // namespace loom::kernels::cuda
