#include "loom/kernels/cuda/adamw.h"

#include <algorithm>
#include <cmath>

#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"

namespace loom::kernels::cuda {

namespace {

struct Hyper {
  float lr, beta1, beta2, eps, weight_decay, grad_scale, bias1, bias2;
};

Hyper hyper(const kernels::AdamWStep& s) {
  return Hyper{s.lr,
               s.beta1,
               s.beta2,
               s.eps,
               s.weight_decay,
               s.grad_scale,
               1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta1), static_cast<double>(s.step))),
               1.0f - static_cast<float>(std::pow(static_cast<double>(s.beta2), static_cast<double>(s.step)))};
}

// One element's update of p, m and v from its gradient. Every operation rounded on its own (no
// fused multiply-add), in the CPU loop's order: the CPU's arithmetic, to an ulp (the x86-64-v3 CPU
// build contracts some of it into FMAs).
__device__ inline void adamw_values(float& p, float grad, float& m, float& v, const Hyper& h) {
  const float g = __fmul_rn(h.grad_scale, grad);
  m = __fadd_rn(__fmul_rn(h.beta1, m), __fmul_rn(1.0f - h.beta1, g));
  v = __fadd_rn(__fmul_rn(h.beta2, v), __fmul_rn(__fmul_rn(1.0f - h.beta2, g), g));
  const float update = __fdiv_rn(__fdiv_rn(m, h.bias1), __fadd_rn(__fsqrt_rn(__fdiv_rn(v, h.bias2)), h.eps));
  p = __fsub_rn(p, __fmul_rn(h.lr, __fadd_rn(update, __fmul_rn(h.weight_decay, p))));
}

// param16 (null: none): the updated value rounded to bf16 as well.
__device__ inline void adamw_element(float* param, const float* grad, float* m, float* v, int64_t i, const Hyper& h,
                                     __nv_bfloat16* param16 = nullptr) {
  float p = param[i], mi = m[i], vi = v[i];
  adamw_values(p, grad[i], mi, vi, h);
  m[i] = mi;
  v[i] = vi;
  param[i] = p;
  if (param16 != nullptr) param16[i] = __float2bfloat16_rn(p);
}

// Elements [4 q, 4 q + 4) as packs (pack4.cuh): 64 bytes read per thread at once, not 16.
__device__ inline void adamw_pack(const kernels::AdamWTensor& x, int64_t q, const Hyper& h) {
  Pack4<float> p = reinterpret_cast<const Pack4<float>*>(x.param)[q];
  Pack4<float> m = reinterpret_cast<const Pack4<float>*>(x.exp_avg)[q];
  Pack4<float> v = reinterpret_cast<const Pack4<float>*>(x.exp_avg_sq)[q];
  const Pack4<float> g = reinterpret_cast<const Pack4<float>*>(x.grad)[q];
#pragma unroll
  for (int k = 0; k < 4; ++k) adamw_values(p.v[k], g.v[k], m.v[k], v.v[k], h);
  reinterpret_cast<Pack4<float>*>(x.exp_avg)[q] = m;
  reinterpret_cast<Pack4<float>*>(x.exp_avg_sq)[q] = v;
  reinterpret_cast<Pack4<float>*>(x.param)[q] = p;
  if (x.param_bf16 != nullptr) store4(static_cast<__nv_bfloat16*>(x.param_bf16), q, p.v);
}

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, Hyper h) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) adamw_element(param, grad, m, v, i, h);
}

// Up to kMaxTensorsPerLaunch tensors, passed by value; tensor t owns blocks
// [first_block[t], first_block[t + 1]), each block kChunk consecutive elements, four per thread:
// as one pack each where the tensor's four arrays are pack-aligned (packed[t]).
constexpr int64_t kChunk = 4 * kThreads;
struct TensorList {
  kernels::AdamWTensor tensors[kMaxTensorsPerLaunch];
  int64_t first_block[kMaxTensorsPerLaunch + 1];
  bool packed[kMaxTensorsPerLaunch];
  int count;
};

__device__ inline __nv_bfloat16* param16(const kernels::AdamWTensor& x) {
  return static_cast<__nv_bfloat16*>(x.param_bf16);
}

__global__ void adamw_many_kernel(const __grid_constant__ TensorList list, Hyper h) {
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= static_cast<int64_t>(blockIdx.x)) ++t;
  const kernels::AdamWTensor& x = list.tensors[t];
  const int64_t begin = (blockIdx.x - list.first_block[t]) * kChunk;
  const int64_t end = min(x.n, begin + kChunk);
  if (list.packed[t]) {
    const int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x);
    if (i + 4 <= end) {
      adamw_pack(x, i / 4, h);
    } else {
      for (int64_t j = i; j < end; ++j) adamw_element(x.param, x.grad, x.exp_avg, x.exp_avg_sq, j, h, param16(x));
    }
    return;
  }
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    adamw_element(x.param, x.grad, x.exp_avg, x.exp_avg_sq, i, h, param16(x));
}

}  // namespace

namespace {

// The CPU's fused multiply-adds, spelled out (__fmaf_rn rounds once, as std::fma).
__global__ void nesterov_outer_kernel(float* __restrict__ anchor, float* __restrict__ momentum,
                                      const float* __restrict__ delta, int64_t n, float lr, float mu) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) {
    const float d = delta[i];
    const float m = __fmaf_rn(mu, momentum[i], d);
    momentum[i] = m;
    anchor[i] = __fmaf_rn(-lr, __fmaf_rn(mu, m, d), anchor[i]);
  }
}

}  // namespace

void nesterov_outer_update(float* anchor, float* momentum, const float* delta, int64_t n, float lr, float mu,
                           cudaStream_t stream) {
  if (n == 0) return;
  nesterov_outer_kernel<<<grid_for(n), kThreads, 0, stream>>>(anchor, momentum, delta, n, lr, mu);
  check_launch("nesterov_outer_kernel");
}

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const kernels::AdamWStep& s, cudaStream_t stream) {
  if (n == 0) return;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(param, grad, exp_avg, exp_avg_sq, n, hyper(s));
  check_launch("adamw_kernel");
}

void adamw_update_many(const kernels::AdamWTensor* tensors, int64_t count, const kernels::AdamWStep& s,
                       cudaStream_t stream) {
  const Hyper h = hyper(s);
  int64_t next = 0;
  while (next < count) {
    TensorList list{};
    int64_t blocks = 0;
    for (; next < count && list.count < kMaxTensorsPerLaunch; ++next) {
      if (tensors[next].n == 0) continue;
      const kernels::AdamWTensor& x = tensors[next];
      list.tensors[list.count] = x;
      list.packed[list.count] = pack4_aligned<float>(x.param) && pack4_aligned<float>(x.grad) &&
                                pack4_aligned<float>(x.exp_avg) && pack4_aligned<float>(x.exp_avg_sq) &&
                                (x.param_bf16 == nullptr || pack4_aligned<__nv_bfloat16>(x.param_bf16));
      list.first_block[list.count] = blocks;
      blocks += (tensors[next].n + kChunk - 1) / kChunk;
      ++list.count;
    }
    if (list.count == 0) continue;
    list.first_block[list.count] = blocks;
    adamw_many_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(list, h);
    check_launch("adamw_many_kernel");
  }
}

}  // namespace loom::kernels::cuda
