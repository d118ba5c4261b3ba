#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/norm_blocks.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/norm_math.cuh"
#include "loom/kernels/cuda/layernorm.h"

namespace loom::kernels::cuda {

namespace {

// A block per row, the rows walked grid-stride; with `amax`, max |output| taken too (T = Discard:
// the statistics and amax alone, nothing stored).
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const float* in, const float* weight,
                                         const float* bias, int64_t rows, int64_t dim, float eps, unsigned* amax) {
  __shared__ float shared[kThreads];
  float m = 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = in + r * dim;
    const LayerRowStats stats = layer_row_stats(x, dim, eps, shared);
    if (threadIdx.x == 0) {
      mean[r] = stats.mean;
      rstd[r] = stats.rstd;
    }
    if (!outputs_wanted<T>(amax)) continue;
    T* y = out + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      m = nan_max(m, fabsf(store(y, i, layer_value(x[i], stats.mean, stats.rstd, weight[i], bias[i]))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// A block per run of `block_rows` rows: each row's din, and the run's weight and bias gradients
// summed in row order in shared memory (each thread its own columns), left as the block's rows of
// `partial` ([blocks, dim] for the weight, then the same for the bias).
__global__ void layernorm_backward_kernel(float* din, float* partial, const float* dout, const float* in,
                                          const float* weight, const float* mean, const float* rstd, int64_t rows,
                                          int64_t dim, int64_t block_rows) {
  __shared__ float shared[kThreads / 32];
  extern __shared__ float dw[];  // [dim] weight, then [dim] bias
  float* db = dw + dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dw[i] = db[i] = 0.0f;
  const int64_t first = blockIdx.x * block_rows, last = min(rows, first + block_rows);
  for (int64_t r = first; r < last; ++r) {
    const float* x = in + r * dim;
    const float* dy = dout + r * dim;
    const float m = mean[r], s = rstd[r];
    float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float dnorm = dy[i] * weight[i];
      dnorm_sum += dnorm;
      dnorm_xhat_sum += dnorm * (x[i] - m) * s;
    }
    const float mean_dnorm = block_sum(dnorm_sum, shared) / static_cast<float>(dim);
    const float mean_dnorm_xhat = block_sum(dnorm_xhat_sum, shared) / static_cast<float>(dim);
    float* dx = din + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float xhat = (x[i] - m) * s;
      dx[i] += (dy[i] * weight[i] - mean_dnorm - xhat * mean_dnorm_xhat) * s;
      dw[i] += dy[i] * xhat;
      db[i] += dy[i];
    }
  }
  const int64_t blocks = gridDim.x;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    partial[blockIdx.x * dim + i] = dw[i];
    partial[(blocks + blockIdx.x) * dim + i] = db[i];
  }
}

template <typename T>
void launch_forward(T* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                    int64_t rows, int64_t dim, float eps, float* amax, cudaStream_t stream) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<norm_rows_grid(rows, amax), kThreads, 0, stream>>>(
      out, mean, rstd, in, weight, bias, rows, dim, eps, reinterpret_cast<unsigned*>(amax));
  check_launch("layernorm_forward_kernel");
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                       int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  launch_forward(out, mean, rstd, in, weight, bias, rows, dim, eps, nullptr, stream);
}

void layernorm_forward_bf16(void* out16, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  launch_forward(static_cast<__nv_bfloat16*>(out16), mean, rstd, in, weight, bias, rows, dim, eps, nullptr, stream);
}

void layernorm_statistics(float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                          int64_t rows, int64_t dim, float eps, float* amax, cudaStream_t stream) {
  launch_forward(static_cast<Discard*>(nullptr), mean, rstd, in, weight, bias, rows, dim, eps, amax, stream);
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        cudaStream_t stream) {
  if (rows == 0) return;
  const NormBlocks blocks = norm_blocks(rows, dim, 2, reinterpret_cast<const void*>(&layernorm_backward_kernel));
  Scratch scratch;
  float* partial = scratch.floats(2 * blocks.count * dim);
  layernorm_backward_kernel<<<static_cast<unsigned>(blocks.count), kThreads, blocks.shared_bytes, stream>>>(
      din, partial, dout, in, weight, mean, rstd, rows, dim, blocks.rows);
  check_launch("layernorm_backward_kernel");
  add_partial_column_sums(dweight, partial, blocks.count, dim, stream);
  add_partial_column_sums(dbias, partial + blocks.count * dim, blocks.count, dim, stream);
}

}  // namespace loom::kernels::cuda
