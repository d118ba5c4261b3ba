#include "loom/kernels/cuda/gated_norm.h"

#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/mamba_math.cuh"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/slice_sums.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kWarps = kThreads / 32;

// y * silu(z) of row r, channel c.
__device__ inline double gated_at(const float* y, const float* z, int64_t z_stride, int64_t dim, int64_t r,
                                  int64_t c) {
  const double zc = z[r * z_stride + c];
  return y[r * dim + c] * zc * sigmoid_of(zc);
}

// One warp per (row, group).
__global__ void gated_rmsnorm_forward_kernel(float* __restrict__ out, float* __restrict__ rstd,
                                             const float* __restrict__ y, const float* __restrict__ z,
                                             int64_t z_stride, const float* __restrict__ weight, int64_t rows,
                                             int64_t dim, int64_t group_size, float eps) {
  const int64_t groups = dim / group_size;
  const int64_t pair = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (pair >= rows * groups) return;
  const int lane = threadIdx.x % 32;
  const int64_t r = pair / groups, c0 = (pair % groups) * group_size;
  double squares = 0.0;
  for (int64_t c = c0 + lane; c < c0 + group_size; c += 32) {
    const double g = gated_at(y, z, z_stride, dim, r, c);
    squares += g * g;
  }
  const double scale = 1.0 / sqrt(warp_sum_double(squares) / static_cast<double>(group_size) + eps);
  if (lane == 0) rstd[pair] = static_cast<float>(scale);
  for (int64_t c = c0 + lane; c < c0 + group_size; c += 32)
    out[r * dim + c] = static_cast<float>(gated_at(y, z, z_stride, dim, r, c) * scale * weight[c]);
}

__global__ void gated_rmsnorm_backward_kernel(float* __restrict__ dy, float* __restrict__ dz,
                                              const float* __restrict__ dout, const float* __restrict__ y,
                                              const float* __restrict__ z, int64_t z_stride,
                                              const float* __restrict__ weight, const float* __restrict__ rstd,
                                              int64_t rows, int64_t dim, int64_t group_size) {
  const int64_t groups = dim / group_size;
  const int64_t pair = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (pair >= rows * groups) return;
  const int lane = threadIdx.x % 32;
  const int64_t r = pair / groups, c0 = (pair % groups) * group_size;
  const double scale = rstd[pair];
  double dot = 0.0;
  for (int64_t c = c0 + lane; c < c0 + group_size; c += 32)
    dot += static_cast<double>(dout[r * dim + c]) * weight[c] * gated_at(y, z, z_stride, dim, r, c);
  const double mean_dot = warp_sum_double(dot) / static_cast<double>(group_size);
  for (int64_t c = c0 + lane; c < c0 + group_size; c += 32) {
    const double zc = z[r * z_stride + c], sz = sigmoid_of(zc), silu = zc * sz, yc = y[r * dim + c];
    const double gated = yc * silu;
    const double dgated = scale * (dout[r * dim + c] * weight[c] - gated * scale * scale * mean_dot);
    dy[r * dim + c] += static_cast<float>(dgated * silu);
    dz[r * z_stride + c] += static_cast<float>(dgated * yc * sz * (1.0 + zc * (1.0 - sz)));
  }
}

// partial[slice * dim + c] = the weight's gradient of channel c over the slice's rows.
__global__ void gated_rmsnorm_weight_kernel(double* __restrict__ partial, const float* __restrict__ dout,
                                            const float* __restrict__ y, const float* __restrict__ z,
                                            int64_t z_stride, const float* __restrict__ rstd, int64_t rows,
                                            int64_t dim, int64_t group_size, int64_t slices) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, slice = blockIdx.y;
  if (c >= dim) return;
  const int64_t per = (rows + slices - 1) / slices, begin = slice * per, end = begin + per < rows ? begin + per : rows;
  const int64_t groups = dim / group_size;
  double sum = 0.0;
  for (int64_t r = begin; r < end; ++r)
    sum += static_cast<double>(dout[r * dim + c]) * gated_at(y, z, z_stride, dim, r, c) *
           rstd[r * groups + c / group_size];
  partial[slice * dim + c] = sum;
}

unsigned warp_blocks(int64_t pairs) { return static_cast<unsigned>((pairs + kWarps - 1) / kWarps); }

}  // namespace

void gated_rmsnorm_forward(float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                           const float* weight, int64_t rows, int64_t dim, int64_t group_size, float eps,
                           cudaStream_t stream) {
  if (rows * dim == 0) return;
  gated_rmsnorm_forward_kernel<<<warp_blocks(rows * (dim / group_size)), kThreads, 0, stream>>>(
      out, rstd, y, z, z_stride, weight, rows, dim, group_size, eps);
  check_launch("gated_rmsnorm_forward_kernel");
}

void gated_rmsnorm_backward(float* dy, float* dz, float* dweight, const float* dout, const float* y, const float* z,
                            int64_t z_stride, const float* weight, const float* rstd, int64_t rows, int64_t dim,
                            int64_t group_size, cudaStream_t stream) {
  if (rows * dim == 0) return;
  gated_rmsnorm_backward_kernel<<<warp_blocks(rows * (dim / group_size)), kThreads, 0, stream>>>(
      dy, dz, dout, y, z, z_stride, weight, rstd, rows, dim, group_size);
  check_launch("gated_rmsnorm_backward_kernel");
  Scratch scratch;
  const int64_t slices = row_slices(rows, dim);
  double* partial = scratch.of<double>(slices * dim);
  const dim3 grid(static_cast<unsigned>((dim + kThreads - 1) / kThreads), static_cast<unsigned>(slices));
  gated_rmsnorm_weight_kernel<<<grid, kThreads, 0, stream>>>(partial, dout, y, z, z_stride, rstd, rows, dim,
                                                             group_size, slices);
  check_launch("gated_rmsnorm_weight_kernel");
  add_slice_sums(dweight, partial, slices, dim, dim, stream);
}

}  // namespace loom::kernels::cuda
