#include "loom/kernels/cuda/adamw.h"

#include <cmath>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

namespace {

struct Hyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, bias1, bias2;
};

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, Hyper h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // Every operation rounded on its own (no fused multiply-add), in the CPU loop's order, so
    // the result is bit for bit the CPU's.
    const float g = __fmul_rn(h.grad_scale, grad[i]);
    const float mi = __fadd_rn(__fmul_rn(h.beta1, m[i]), __fmul_rn(1.0f - h.beta1, g));
    const float vi = __fadd_rn(__fmul_rn(h.beta2, v[i]), __fmul_rn(__fmul_rn(1.0f - h.beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float update = __fdiv_rn(__fdiv_rn(mi, h.bias1), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, h.bias2)), h.eps));
    const float p = param[i];
    param[i] = __fsub_rn(p, __fmul_rn(h.lr, __fadd_rn(update, __fmul_rn(h.weight_decay, p))));
  }
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const kernels::AdamWStep& s, cudaStream_t stream) {
  if (n == 0) return;
  const Hyper h{s.lr,
                s.beta1,
                s.beta2,
                s.eps,
                s.weight_decay,
                s.grad_scale,
                1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step))),
                1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step)))};
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((n + kThreads - 1) / kThreads, 65536);
  adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, h);
  check_launch("adamw_kernel");
}

}  // namespace loom::kernels::cuda
