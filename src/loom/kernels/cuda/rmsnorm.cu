#include "loom/kernels/cuda/rmsnorm.h"

#include "loom/kernels/cuda/bf16_io.cuh"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/norm_blocks.h"
#include "loom/kernels/cuda/norm_math.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

// A block per row, the rows walked grid-stride; with `amax`, max |output| taken too (T = Discard:
// the statistics and amax alone, nothing stored).
template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const float* in, const float* weight, int64_t rows,
                                       int64_t dim, float eps, unsigned* amax) {
  __shared__ float shared[kThreads];
  float m = 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* x = in + r * dim;
    const float s = rms_row_rstd(x, dim, eps, shared);
    if (threadIdx.x == 0) rstd[r] = s;
    if (!outputs_wanted<T>(amax)) continue;
    T* y = out + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
      m = nan_max(m, fabsf(store(y, i, rms_value(x[i], s, weight[i]))));
  }
  if (amax != nullptr) block_amax_into(amax, m);
}

// A block per run of `block_rows` rows: each row's din, and the run's weight gradient summed in
// row order in shared memory (each thread its own columns), left as the block's row of `partial`.
__global__ void rmsnorm_backward_kernel(float* din, float* partial, const float* dout, const float* in,
                                        const float* weight, const float* rstd, int64_t rows, int64_t dim,
                                        int64_t block_rows) {
  __shared__ float shared[kThreads];
  extern __shared__ float dw[];  // [dim]
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dw[i] = 0.0f;
  const int64_t first = blockIdx.x * block_rows, last = min(rows, first + block_rows);
  for (int64_t r = first; r < last; ++r) {
    const float* x = in + r * dim;
    const float* dy = dout + r * dim;
    const float s = rstd[r];
    float dot = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) dot += dy[i] * weight[i] * x[i];
    const float coeff = tree_block_sum(dot, shared) * s * s * s / static_cast<float>(dim);
    float* dx = din + r * dim;
    for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      dx[i] += dy[i] * weight[i] * s - x[i] * coeff;
      dw[i] += dy[i] * x[i] * s;
    }
  }
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) partial[blockIdx.x * dim + i] = dw[i];
}

template <typename T>
void launch_forward(T* out, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim, float eps,
                    float* amax, cudaStream_t stream) {
  if (rows == 0) return;
  rmsnorm_forward_kernel<<<norm_rows_grid(rows, amax), kThreads, 0, stream>>>(out, rstd, in, weight, rows, dim, eps,
                                                                            reinterpret_cast<unsigned*>(amax));
  check_launch("rmsnorm_forward_kernel");
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                     float eps, cudaStream_t stream) {
  launch_forward(out, rstd, in, weight, rows, dim, eps, nullptr, stream);
}

void rmsnorm_forward_bf16(void* out16, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                          float eps, cudaStream_t stream) {
  launch_forward(static_cast<__nv_bfloat16*>(out16), rstd, in, weight, rows, dim, eps, nullptr, stream);
}

void rmsnorm_statistics(float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* amax, cudaStream_t stream) {
  launch_forward(static_cast<Discard*>(nullptr), rstd, in, weight, rows, dim, eps, amax, stream);
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t dim, cudaStream_t stream) {
  if (rows == 0) return;
  const NormBlocks blocks = norm_blocks(rows, dim, 1, reinterpret_cast<const void*>(&rmsnorm_backward_kernel));
  Scratch scratch;
  float* partial = scratch.floats(blocks.count * dim);
  rmsnorm_backward_kernel<<<static_cast<unsigned>(blocks.count), kThreads, blocks.shared_bytes, stream>>>(
      din, partial, dout, in, weight, rstd, rows, dim, blocks.rows);
  check_launch("rmsnorm_backward_kernel");
  add_partial_column_sums(dweight, partial, blocks.count, dim, stream);
}

}  // namespace loom::kernels::cuda
