#include "loom/kernels/cuda/adamw.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "loom/kernels/cuda/amax.cuh"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/pack4.cuh"
#include "loom/kernels/cuda/tiled_cast.cuh"
#include "loom/kernels/precision_gemm.h"

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

// param16 (null: none): the updated value rounded to bf16 as well. Returns the updated value.
__device__ inline float adamw_element(float* param, const float* grad, float* m, float* v, int64_t i, const Hyper& h,
                                      __nv_bfloat16* param16 = nullptr) {
  float p = param[i], mi = m[i], vi = v[i];
  adamw_values(p, grad[i], mi, vi, h);
  m[i] = mi;
  v[i] = vi;
  param[i] = p;
  if (param16 != nullptr) param16[i] = __float2bfloat16_rn(p);
  return p;
}

// Elements [4 q, 4 q + 4) of the four arrays as packs (pack4.cuh): 64 bytes read per thread at
// once, not 16. load, then store: the updated values stored, and into `out`.
struct AdamWPack {
  int64_t q;
  Pack4<float> p, g, m, v;
  __device__ static AdamWPack load(const float* param, const float* grad, const float* exp_avg,
                                   const float* exp_avg_sq, int64_t q) {
    return {q, reinterpret_cast<const Pack4<float>*>(param)[q], reinterpret_cast<const Pack4<float>*>(grad)[q],
            reinterpret_cast<const Pack4<float>*>(exp_avg)[q], reinterpret_cast<const Pack4<float>*>(exp_avg_sq)[q]};
  }
  __device__ void store(float* param, float* exp_avg, float* exp_avg_sq, const Hyper& h, float (&out)[4]) const {
    Pack4<float> new_p = p, new_m = m, new_v = v;
#pragma unroll
    for (int k = 0; k < 4; ++k) adamw_values(new_p.v[k], g.v[k], new_m.v[k], new_v.v[k], h);
    reinterpret_cast<Pack4<float>*>(exp_avg)[q] = new_m;
    reinterpret_cast<Pack4<float>*>(exp_avg_sq)[q] = new_v;
    reinterpret_cast<Pack4<float>*>(param)[q] = new_p;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = new_p.v[k];
  }
};

__global__ void adamw_kernel(float* __restrict__ param, const float* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, int64_t n, Hyper h) {
  for (int64_t i = grid_start(); i < n; i += grid_stride()) adamw_element(param, grad, m, v, i, h);
}

__host__ __device__ inline __nv_bfloat16* param16(const kernels::AdamWTensor& x) {
  return static_cast<__nv_bfloat16*>(x.param_bf16);
}

// One tensor of a multi-tensor launch: what the kernel reads of an AdamWTensor.
struct ListedTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  __nv_bfloat16* param16;
  float* amax;   // fp8.amax
  int hyper;     // into TensorList::hypers
  bool packed;   // the arrays pack-aligned
};

// Up to kMaxTensorsPerLaunch tensors and their steps' hyper-parameters, passed by value; tensor t
// owns blocks [first_block[t], first_block[t + 1]), each block kChunk consecutive elements, four
// per thread: as one pack each where the tensor's arrays are pack-aligned.
constexpr int64_t kChunk = 4 * kThreads;
struct TensorList {
  ListedTensor tensors[kMaxTensorsPerLaunch];
  int64_t first_block[kMaxTensorsPerLaunch + 1];
  Hyper hypers[kernels::kMaxAdamWSteps];
  int count;
};
// Kernel arguments by value: 4 KB is what every CUDA version takes.
static_assert(sizeof(TensorList) <= 4096, "AdamW's tensor list must stay a kernel argument");

// A tensor's amax (where set) takes max |updated value| of each block's elements: one atomic per
// block (amax.cuh), a tensor's blocks being its own.
__global__ void adamw_many_kernel(const __grid_constant__ TensorList list) {
  int t = 0;
  while (t + 1 < list.count && list.first_block[t + 1] <= static_cast<int64_t>(blockIdx.x)) ++t;
  const ListedTensor& x = list.tensors[t];
  const Hyper& h = list.hypers[x.hyper];
  const int64_t begin = (blockIdx.x - list.first_block[t]) * kChunk;
  const int64_t end = min(x.n, begin + kChunk);
  float m = 0.0f;
  if (x.packed) {
    const int64_t i = begin + 4 * static_cast<int64_t>(threadIdx.x);
    if (i + 4 <= end) {
      float p[4];
      AdamWPack::load(x.param, x.grad, x.exp_avg, x.exp_avg_sq, i / 4).store(x.param, x.exp_avg, x.exp_avg_sq, h, p);
      if (x.param16 != nullptr) store4(x.param16, i / 4, p);
#pragma unroll
      for (int k = 0; k < 4; ++k) m = nan_max(m, fabsf(p[k]));
    } else {
      for (int64_t j = i; j < end; ++j)
        m = nan_max(m, fabsf(adamw_element(x.param, x.grad, x.exp_avg, x.exp_avg_sq, j, h, x.param16)));
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      m = nan_max(m, fabsf(adamw_element(x.param, x.grad, x.exp_avg, x.exp_avg_sq, i, h, x.param16)));
  }
  if (x.amax != nullptr) block_amax_into(reinterpret_cast<unsigned*>(x.amax), m);  // uniform per block
}

// Element [r, c] of a weight [rows, cols] updated as the tiled cast reads it (tiled_cast.cuh's
// value, kUpdates: each evaluated once): its new p, m and v (and bf16 p, where param16) stored, the
// new p returned to be cast.
struct AdamWAt {
  static constexpr bool kUpdates = true;
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  __nv_bfloat16* param16;
  int64_t cols;
  Hyper h;
  __device__ float operator()(int64_t r, int64_t c) const {
    return adamw_element(param, grad, exp_avg, exp_avg_sq, r * cols + c, h, param16);
  }
  using Reads = AdamWPack;
  __device__ Reads read4(int64_t r, int64_t c) const {
    return AdamWPack::load(param, grad, exp_avg, exp_avg_sq, (r * cols + c) / 4);
  }
  __device__ void value4(const Reads& a, float (&v)[4]) const {
    a.store(param, exp_avg, exp_avg_sq, h, v);
    if (param16 != nullptr) store4(param16, a.q, v);
  }
  bool packs4() const {
    return pack4_aligned<float>(param) && pack4_aligned<float>(grad) && pack4_aligned<float>(exp_avg) &&
           pack4_aligned<float>(exp_avg_sq) && (param16 == nullptr || pack4_aligned<__nv_bfloat16>(param16)) &&
           cols % 4 == 0;
  }
};

// A weight's two stores' scale pairs (the forward's, dgrad's transposed).
std::pair<float*, float*> scale_pairs(const kernels::AdamWFp8Weight& w) {
  const int64_t forward_offset = weight_cast_layout(OperandCast::Fp8Tensor, w.rows, w.cols).scale_offset;
  const int64_t transposed_offset = weight_cast_layout(OperandCast::Fp8Tensor, w.cols, w.rows).scale_offset;
  return {reinterpret_cast<float*>(static_cast<uint8_t*>(w.forward) + forward_offset),
          reinterpret_cast<float*>(static_cast<uint8_t*>(w.transposed) + transposed_offset)};
}

// The scale pairs of up to kMaxTensorsPerLaunch weights, one thread each, as tensor_scale_kernel
// writes a host scale's (quantize.cu), in one launch.
struct ScalePairs {
  float* forward[kMaxTensorsPerLaunch];
  float* transposed[kMaxTensorsPerLaunch];
  float scale[kMaxTensorsPerLaunch];
  int count;
};
static_assert(sizeof(ScalePairs) <= 4096, "the scale pairs must stay a kernel argument");
__global__ void scale_pairs_kernel(const __grid_constant__ ScalePairs s) {
  const int i = static_cast<int>(threadIdx.x);
  if (i >= s.count) return;
  store_fp8_scale_pair(s.forward[i], s.scale[i]);
  store_fp8_scale_pair(s.transposed[i], s.scale[i]);
}

// The FP8 weights with codes among `tensors`: their scale pairs, a launch per kMaxTensorsPerLaunch,
// then each weight's update through the tiled cast, which writes both stores' codes and takes the
// amax from the values it updates.
void adamw_fp8_weights(const kernels::AdamWTensor* tensors, int64_t count, const Hyper* hypers,
                       cudaStream_t stream) {
  ScalePairs pairs{};
  auto flush = [&] {
    if (pairs.count == 0) return;
    scale_pairs_kernel<<<1, kMaxTensorsPerLaunch, 0, stream>>>(pairs);
    check_launch("scale_pairs_kernel");
    pairs = ScalePairs{};
  };
  for (int64_t i = 0; i < count; ++i) {
    const kernels::AdamWTensor& x = tensors[i];
    const kernels::AdamWFp8Weight& w = x.fp8;
    if (w.forward == nullptr || x.n == 0) continue;
    std::tie(pairs.forward[pairs.count], pairs.transposed[pairs.count]) = scale_pairs(w);
    pairs.scale[pairs.count++] = w.scale;
    if (pairs.count == kMaxTensorsPerLaunch) flush();
  }
  flush();
  for (int64_t i = 0; i < count; ++i) {
    const kernels::AdamWTensor& x = tensors[i];
    const kernels::AdamWFp8Weight& w = x.fp8;
    if (w.forward == nullptr || x.n == 0) continue;
    launch_tiled_cast(AdamWAt{x.param, x.grad, x.exp_avg, x.exp_avg_sq, param16(x), w.cols, hypers[x.step_index]},
                      static_cast<uint8_t*>(w.transposed), static_cast<uint8_t*>(w.forward), w.rows, w.cols,
                      Caster<CastTo::E4M3>{scale_pairs(w).first}, stream, "adamw_fp8_weight", w.amax);
  }
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

void adamw_update_many(const kernels::AdamWTensor* tensors, int64_t count, const kernels::AdamWStep* steps,
                       int64_t step_count, cudaStream_t stream) {
  // kernels::adamw_update_many checked the steps, each tensor's step_index and FP8 weight.
  Hyper hypers[kernels::kMaxAdamWSteps];
  for (int64_t s = 0; s < step_count; ++s) hypers[s] = hyper(steps[s]);
  adamw_fp8_weights(tensors, count, hypers, stream);
  int64_t next = 0;
  while (next < count) {
    TensorList list{};
    std::copy(hypers, hypers + step_count, list.hypers);
    int64_t blocks = 0;
    for (; next < count && list.count < kMaxTensorsPerLaunch; ++next) {
      const kernels::AdamWTensor& x = tensors[next];
      if (x.n == 0 || x.fp8.forward != nullptr) continue;  // above
      const bool packed = pack4_aligned<float>(x.param) && pack4_aligned<float>(x.grad) &&
                          pack4_aligned<float>(x.exp_avg) && pack4_aligned<float>(x.exp_avg_sq) &&
                          (x.param_bf16 == nullptr || pack4_aligned<__nv_bfloat16>(x.param_bf16));
      list.tensors[list.count] = {x.param, x.grad,       x.exp_avg,    x.exp_avg_sq, x.n,
                                  param16(x), x.fp8.amax, x.step_index, packed};
      list.first_block[list.count] = blocks;
      blocks += (x.n + kChunk - 1) / kChunk;
      ++list.count;
    }
    if (list.count == 0) continue;
    list.first_block[list.count] = blocks;
    adamw_many_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(list);
    check_launch("adamw_many_kernel");
  }
}

}  // namespace loom::kernels::cuda
