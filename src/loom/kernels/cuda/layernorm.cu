#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/layernorm.h"

namespace loom::kernels::cuda {

namespace {

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* in, const float* weight,
                                         const float* bias, int64_t dim, float eps) {
  __shared__ float shared[kThreads / 32];
  const float* x = in + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += x[i];
  const float m = block_sum(sum, shared) / static_cast<float>(dim);
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) var += (x[i] - m) * (x[i] - m);
  const float s = rsqrtf(block_sum(var, shared) / static_cast<float>(dim) + eps);
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
  float* y = out + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) y[i] = (x[i] - m) * s * weight[i] + bias[i];
}

__global__ void layernorm_backward_kernel(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                                          const float* weight, const float* mean, const float* rstd, int64_t dim) {
  __shared__ float shared[kThreads / 32];
  const float* x = in + blockIdx.x * dim;
  const float* dy = dout + blockIdx.x * dim;
  const float m = mean[blockIdx.x], s = rstd[blockIdx.x];
  float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float dnorm = dy[i] * weight[i];
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * (x[i] - m) * s;
  }
  const float mean_dnorm = block_sum(dnorm_sum, shared) / static_cast<float>(dim);
  const float mean_dnorm_xhat = block_sum(dnorm_xhat_sum, shared) / static_cast<float>(dim);
  float* dx = din + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float xhat = (x[i] - m) * s;
    dx[i] += (dy[i] * weight[i] - mean_dnorm - xhat * mean_dnorm_xhat) * s;
    atomicAdd(dweight + i, dy[i] * xhat);
    atomicAdd(dbias + i, dy[i]);
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                       int64_t rows, int64_t dim, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  layernorm_forward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(out, mean, rstd, in, weight, bias,
                                                                                 dim, eps);
  check_launch("layernorm_forward_kernel");
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        cudaStream_t stream) {
  if (rows == 0) return;
  layernorm_backward_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(din, dweight, dbias, dout, in,
                                                                                  weight, mean, rstd, dim);
  check_launch("layernorm_backward_kernel");
}

}  // namespace loom::kernels::cuda
