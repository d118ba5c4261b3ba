#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/moe_router.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kMaxTopK = 64;
// The scores and the gradient of a token's row in shared memory: 8 bytes per expert, 40 KiB at most.
constexpr int kMaxExperts = 5120;

// block_sum_double after every thread has read the previous call's total.
__device__ double block_total(double v) {
  __syncthreads();
  return block_sum_double(v);
}

// s[e] = the token's scores, as the forward's (kernels/router_scores.h); `reduce` for block_max.
__device__ void scores_of_row(const RouterBackward& r, const float* l, float* s, float* reduce) {
  const int E = r.experts;
  if (r.kind == RouterKind::Sigmoid) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) s[e] = 1.0f / (1.0f + expf(-l[e]));
    return;
  }
  float m = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
  m = block_max(m, reduce);
  double sum = 0.0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s[e] = expf(l[e] - m);
    sum += s[e];
  }
  const float inv = static_cast<float>(1.0 / block_total(sum));
  for (int e = threadIdx.x; e < E; e += blockDim.x) s[e] *= inv;
}

// dl += the gradient of sum_i dw[i] * weight[i]: k terms in the CPU's order by one thread (and
// softmax_topk's term over every expert by all).
__device__ void weights_gradient(const RouterBackward& r, const float* s, const int32_t* ex, const float* w,
                                 const float* dw, float* dl, double* shared_dot) {
  const int E = r.experts, k = r.top_k;
  const float scale = r.topk_scaling;
  if (threadIdx.x == 0) {
    if (r.kind == RouterKind::TopkSoftmax) {
      double dot = 0.0;
      for (int i = 0; i < k; ++i) dot += (w[i] / scale) * (dw[i] * scale);
      for (int i = 0; i < k; ++i) dl[ex[i]] += (w[i] / scale) * static_cast<float>(dw[i] * scale - dot);
    } else if (r.kind == RouterKind::SoftmaxTopk) {
      double dot = 0.0;
      for (int i = 0; i < k; ++i) dot += s[ex[i]] * dw[i] * scale;
      *shared_dot = dot;
    } else {
      double sum = 0.0, dot = 0.0;
      for (int i = 0; i < k; ++i) {
        sum += s[ex[i]];
        dot += dw[i] * s[ex[i]];
      }
      for (int i = 0; i < k; ++i) {
        const double ds = scale * (dw[i] / sum - dot / (sum * sum));
        dl[ex[i]] += static_cast<float>(ds * s[ex[i]] * (1.0 - s[ex[i]]));
      }
    }
  }
  __syncthreads();
  if (r.kind != RouterKind::SoftmaxTopk) return;
  const float dot = static_cast<float>(*shared_dot);
  for (int e = threadIdx.x; e < E; e += blockDim.x) dl[e] -= s[e] * dot;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 0; i < k; ++i) dl[ex[i]] += s[ex[i]] * dw[i] * scale;
  }
  __syncthreads();
}

// dl += aux_scale times the gradient of token t's share of the balancing loss and the z-loss.
__device__ void losses_gradient(const RouterBackward& r, int64_t t, const float* l, const float* s, float* dl,
                                float* reduce) {
  const int E = r.experts;
  if (r.aux_f != nullptr) {
    const int64_t g = t / r.group_tokens;
    const double factor = r.aux_scale * r.aux_factor[g];
    const float* f = r.aux_f + g * E;
    double norm = 1.0;
    if (r.kind == RouterKind::Sigmoid) {
      double part = 0.0;
      for (int e = threadIdx.x; e < E; e += blockDim.x) part += s[e];
      norm = block_total(part);
    }
    double part = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) part += s[e] / norm * factor * f[e];
    const double dot = block_total(part);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const double dq = factor * f[e];
      if (r.kind == RouterKind::Sigmoid) {
        dl[e] += static_cast<float>((dq - dot) / norm * s[e] * (1.0 - s[e]));
      } else {
        dl[e] += static_cast<float>(s[e] * (dq - dot));
      }
    }
  }
  if (r.z_loss_coeff > 0.0) {
    float m = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    m = block_max(m, reduce);
    double part = 0.0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) part += exp(static_cast<double>(l[e] - m));
    const double lse = m + log(block_total(part));
    const double c = r.aux_scale * r.z_loss_coeff * 2.0 * lse / static_cast<double>(r.tokens);
    for (int e = threadIdx.x; e < E; e += blockDim.x) dl[e] += static_cast<float>(c * exp(l[e] - lse));
  }
}

// A block per token (grid-stride): its scores and logits' gradient in shared memory.
__global__ void __launch_bounds__(kThreads) moe_router_backward_kernel(float* __restrict__ d_logits,
                                                                       const RouterBackward r) {
  extern __shared__ float row[];
  __shared__ float reduce[kThreads / 32];
  __shared__ float dw[kMaxTopK];
  __shared__ double shared_dot;
  const int E = r.experts, k = r.top_k;
  float* s = row;       // the token's scores
  float* dl = row + E;  // and its logits' gradient
  for (int64_t t = blockIdx.x; t < r.tokens; t += gridDim.x) {
    const float* l = r.logits + t * E;
    scores_of_row(r, l, s, reduce);
    for (int e = threadIdx.x; e < E; e += blockDim.x) dl[e] = 0.0f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
      const int32_t selected = r.selection_row[t * k + i];
      dw[i] = selected < 0 ? 0.0f : static_cast<float>(r.row_grad[selected]);
    }
    __syncthreads();
    weights_gradient(r, s, r.expert + t * k, r.weight + t * k, dw, dl, &shared_dot);
    if (t >= r.first && t < r.end) losses_gradient(r, t, l, s, dl, reduce);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) d_logits[t * E + e] = dl[e];
    __syncthreads();  // the next token's row reuses the shared memory
  }
}

}  // namespace

void moe_router_backward(float* d_logits, const RouterBackward& r, cudaStream_t stream) {
  LOOM_CHECK(r.top_k <= kMaxTopK && r.experts <= kMaxExperts,
             "moe_router_backward on a GPU: at most " + std::to_string(kMaxTopK) + " selections of " +
                 std::to_string(kMaxExperts) + " experts per token (model.moe_top_k " + std::to_string(r.top_k) +
                 ", model.moe_experts " + std::to_string(r.experts) + ")");
  if (r.tokens == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(r.tokens, 65536));
  const size_t shared = 2 * static_cast<size_t>(r.experts) * sizeof(float);
  moe_router_backward_kernel<<<blocks, kThreads, shared, stream>>>(d_logits, r);
  check_launch("moe_router_backward_kernel");
}

}  // namespace loom::kernels::cuda
