#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/moe_router.h"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kMaxTopK = 64;
// A token's row in shared memory: 8 bytes per expert (the backward's scores and gradient) or 9 (the
// forward's scores, selection values and flags), 45 KiB at most.
constexpr int kMaxExperts = 5120;

// block_sum_double after every thread has read the previous call's total.
__device__ double block_total(double v) {
  __syncthreads();
  return block_sum_double(v);
}

// log(sum_e exp(l[e])) in double from the row's max, as the CPU's (every thread gets it).
__device__ double row_log_sum_exp(const float* l, int E, float* reduce) {
  float m = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
  m = block_max(m, reduce);
  double part = 0.0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) part += exp(static_cast<double>(l[e] - m));
  return m + log(block_total(part));
}

// s[e] = the token's scores, as the CPU's (kernels/router_scores.h); `reduce` for block_max.
__device__ void scores_of_row(RouterKind kind, int E, const float* l, float* s, float* reduce) {
  if (kind == RouterKind::Sigmoid) {
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
    const double lse = row_log_sum_exp(l, E, reduce);
    const double c = r.aux_scale * r.z_loss_coeff * 2.0 * lse / static_cast<double>(r.tokens);
    for (int e = threadIdx.x; e < E; e += blockDim.x) dl[e] += static_cast<float>(c * exp(l[e] - lse));
  }
}

// The (value, index) of the larger value, the lower index between equal ones; index -1: none.
struct Candidate {
  float value;
  int index;
};
__device__ Candidate better(Candidate a, Candidate b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// The largest value of v among the experts not yet taken, over the block (every thread gets it).
__device__ Candidate block_argmax(const float* v, const unsigned char* taken, int E, Candidate* shared) {
  Candidate c{0.0f, -1};
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    if (!taken[e]) c = better(c, Candidate{v[e], e});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Candidate o{__shfl_xor_sync(0xffffffffu, c.value, offset), __shfl_xor_sync(0xffffffffu, c.index, offset)};
    c = better(c, o);
  }
  __syncthreads();  // `shared` may still be read by the previous call
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = c;
  __syncthreads();
  Candidate best = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) best = better(best, shared[w]);
  return best;
}

// The token's combine weights from its selections, in the CPU's order by one thread.
__device__ void write_weights(const RouterForward& r, const float* l, const float* s, const int32_t* ex, float* w) {
  const int k = r.top_k;
  if (r.kind == RouterKind::TopkSoftmax) {
    float m = l[ex[0]];
    for (int i = 1; i < k; ++i) m = fmaxf(m, l[ex[i]]);
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += w[i] = expf(l[ex[i]] - m);
    const float inv = static_cast<float>(1.0 / sum);
    for (int i = 0; i < k; ++i) w[i] *= inv;
  } else {
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += w[i] = s[ex[i]];
    if (r.kind == RouterKind::Sigmoid) {
      for (int i = 0; i < k; ++i) w[i] = static_cast<float>(w[i] / sum);
    }
  }
  for (int i = 0; i < k; ++i) w[i] *= r.topk_scaling;
}

// A block per token (grid-stride): its scores, its top k, weights and log-sum-exp; with `scores`
// (the balancing loss's sums to follow) its scores and their norm (their sum under sigmoid, else 1).
__global__ void __launch_bounds__(kThreads) moe_router_forward_kernel(const RouterForward r, float* scores,
                                                                      double* norms) {
  extern __shared__ float row[];
  __shared__ float reduce[kThreads / 32];
  __shared__ Candidate candidates[kThreads / 32];
  const int E = r.experts, k = r.top_k;
  float* s = row;
  float* select = row + E;
  auto* taken = reinterpret_cast<unsigned char*>(row + 2 * E);
  for (int64_t t = blockIdx.x; t < r.tokens; t += gridDim.x) {
    const float* l = r.logits + t * E;
    scores_of_row(r.kind, E, l, s, reduce);
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      select[e] = (r.kind == RouterKind::TopkSoftmax ? l[e] : s[e]) + (r.bias != nullptr ? r.bias[e] : 0.0f);
      taken[e] = 0;
    }
    int32_t* ex = r.expert + t * k;
    for (int i = 0; i < k; ++i) {
      const Candidate best = block_argmax(select, taken, E, candidates);
      if (threadIdx.x == 0) ex[i] = best.index;
      // Marked by the thread whose share holds it: the only one that reads that flag.
      if (best.index % static_cast<int>(blockDim.x) == static_cast<int>(threadIdx.x)) taken[best.index] = 1;
    }
    __syncthreads();
    if (threadIdx.x == 0) write_weights(r, l, s, ex, r.weight + t * k);
    if (r.lse != nullptr) {
      const double lse = row_log_sum_exp(l, E, reduce);
      if (threadIdx.x == 0) r.lse[t] = lse;
    }
    if (scores != nullptr) {
      double norm = 1.0;
      if (r.kind == RouterKind::Sigmoid) {
        double part = 0.0;
        for (int e = threadIdx.x; e < E; e += blockDim.x) part += s[e];
        norm = block_total(part);
      }
      for (int e = threadIdx.x; e < E; e += blockDim.x) scores[t * E + e] = s[e];
      if (threadIdx.x == 0) norms[t] = norm;
    }
    __syncthreads();  // the next token's row reuses the shared memory
  }
}

constexpr int64_t kProbChunk = 64;  // tokens per partial sum of the balancing loss's scores

// partial[(g * chunks + c) * E + e] = sum over chunk c of group g's tokens of scores / norm.
__global__ void prob_partials_kernel(double* __restrict__ partial, const float* __restrict__ scores,
                                     const double* __restrict__ norms, int E, int64_t group_tokens,
                                     int64_t chunks, int64_t groups) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= E) return;
  for (int64_t gc = blockIdx.y; gc < groups * chunks; gc += gridDim.y) {
    const int64_t g = gc / chunks, c = gc % chunks;
    const int64_t first = g * group_tokens + c * kProbChunk;
    const int64_t last = min(first + kProbChunk, (g + 1) * group_tokens);
    double sum = 0.0;
    for (int64_t t = first; t < last; ++t) sum += scores[t * E + e] / norms[t];
    partial[gc * E + e] = sum;
  }
}

// prob_sums[g * E + e] = the chunks' partial sums in order.
__global__ void prob_sums_kernel(double* __restrict__ prob_sums, const double* __restrict__ partial, int E,
                                 int64_t chunks, int64_t groups) {
  for (int64_t i = grid_start(); i < groups * E; i += grid_stride()) {
    const int64_t g = i / E, e = i % E;
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[(g * chunks + c) * E + e];
    prob_sums[i] = sum;
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
    scores_of_row(r.kind, E, l, s, reduce);
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

__global__ void sigmoid_gate_kernel(float* __restrict__ gate, const double* __restrict__ logits, int64_t n) {
  for (int64_t t = grid_start(); t < n; t += grid_stride()) gate[t] = static_cast<float>(1.0 / (1.0 + exp(-logits[t])));
}

__global__ void sigmoid_gate_backward_kernel(float* __restrict__ d_logit, const double* __restrict__ dots,
                                             const float* __restrict__ gate, int64_t n) {
  for (int64_t t = grid_start(); t < n; t += grid_stride())
    d_logit[t] = __fmul_rn(__fmul_rn(static_cast<float>(dots[t]), gate[t]), __fsub_rn(1.0f, gate[t]));
}

}  // namespace

void sigmoid_gate(float* gate, const double* logits, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_gate_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, logits, n);
  check_launch("sigmoid_gate_kernel");
}

void sigmoid_gate_backward(float* d_logit, const double* dots, const float* gate, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  sigmoid_gate_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(d_logit, dots, gate, n);
  check_launch("sigmoid_gate_backward_kernel");
}

void moe_router_forward(const RouterForward& r, cudaStream_t stream) {
  LOOM_CHECK(r.top_k <= kMaxTopK && r.experts <= kMaxExperts,
             "moe_router_forward on a GPU: at most " + std::to_string(kMaxTopK) + " selections of " +
                 std::to_string(kMaxExperts) + " experts per token (model.moe_top_k " + std::to_string(r.top_k) +
                 ", model.moe_experts " + std::to_string(r.experts) + ")");
  if (r.tokens == 0) return;
  const int E = r.experts;
  Scratch scratch;  // the scores, their norms and the balancing loss's partial sums, for this call
  float* scores = r.prob_sums != nullptr ? scratch.floats(r.tokens * E) : nullptr;
  double* norms = r.prob_sums != nullptr ? scratch.of<double>(r.tokens) : nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(r.tokens, 65536));
  const size_t shared = 2 * static_cast<size_t>(E) * sizeof(float) + static_cast<size_t>(E);
  moe_router_forward_kernel<<<blocks, kThreads, shared, stream>>>(r, scores, norms);
  check_launch("moe_router_forward_kernel");
  if (r.prob_sums == nullptr) return;
  const int64_t groups = r.tokens / r.group_tokens, chunks = (r.group_tokens + kProbChunk - 1) / kProbChunk;
  double* partial = scratch.of<double>(groups * chunks * E);
  const dim3 grid(static_cast<unsigned>((E + kThreads - 1) / kThreads),
                  static_cast<unsigned>(std::min<int64_t>(groups * chunks, 65535)));
  prob_partials_kernel<<<grid, kThreads, 0, stream>>>(partial, scores, norms, E, r.group_tokens, chunks, groups);
  check_launch("prob_partials_kernel");
  prob_sums_kernel<<<grid_for(groups * E), kThreads, 0, stream>>>(r.prob_sums, partial, E, chunks, groups);
  check_launch("prob_sums_kernel");
}

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
