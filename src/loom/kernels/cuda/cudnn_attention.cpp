#include "loom/kernels/cuda/cudnn_attention.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/cudnn_builder.h"
#include "loom/kernels/cuda/cudnn_library.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/per_device.h"

namespace loom::kernels::cuda {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Why the shape itself is outside what the cuDNN path serves; empty when inside.
std::string shape_refusal(const FlashAttentionShape& s, const AttentionVisibility& vis) {
  if (vis.q_pos != nullptr || vis.k_pos != nullptr || vis.q_doc != nullptr || vis.k_doc != nullptr)
    return "positions or documents given (only plain causal rows are served)";
  if (s.q_len != s.k_len) return "q_len " + std::to_string(s.q_len) + " != k_len " + std::to_string(s.k_len);
  if (s.head_dim != 64 && s.head_dim != 128) return "head_dim " + std::to_string(s.head_dim) + " (64 or 128 served)";
  if (s.kv_heads <= 0 || s.heads % s.kv_heads != 0) return "heads not a multiple of kv_heads";
  if (s.batch <= 0 || s.q_len <= 0) return "an empty call";
  for (const int64_t stride : {s.q_stride, s.k_stride, s.v_stride, s.out_stride})
    if (stride % 8 != 0) return "a row stride of " + std::to_string(stride) + " elements (multiples of 8 served)";
  return {};
}

}  // namespace

std::string cudnn_attention_refusal(const FlashAttentionShape& s, const AttentionVisibility& vis,
                                    std::initializer_list<const void*> tensors) {
  const CudnnStatus& status = cudnn_status();
  if (!status.available) return "cuDNN unavailable: " + status.reason;
  // cudnn-frontend refuses the 16-bit SDPA forward on these two releases too (known bugs).
  if (status.version == 91000 || status.version == 91001)
    return "cuDNN " + std::to_string(status.version) + "'s SDPA (known bugs in 9.10.0 and 9.10.1)";
  std::string why = shape_refusal(s, vis);
  if (!why.empty()) return why;
  for (const void* t : tensors)
    if (!aligned16(t)) return "a tensor not 16-byte aligned";
  return {};
}

std::string cudnn_backward_refusal(const FlashAttentionShape& s) {
  const long version = cudnn_status().version;
  if (!cudnn_status().available) return {};
  if (s.q_len == 1 && s.k_len == 1) return "one query and one key (cuDNN's SDPA backward does not serve them)";
  if (version == 91000 || version == 91001)
    return "cuDNN " + std::to_string(version) + "'s SDPA backward (known bugs in 9.10.0 and 9.10.1)";
  if (version <= 91500 && s.k_len % 128 != 0)
    return "k_len " + std::to_string(s.k_len) + " not a multiple of 128 on cuDNN " + std::to_string(version) +
           " (its SDPA backward needs a padding mask there up to 9.15.0)";
  return {};
}

#ifndef LOOM_HAVE_CUDNN_HEADERS

std::string cudnn_attention_prepare(const FlashAttentionShape&, bool, const CudnnGradientStrides&) {
  return cudnn_status().reason;
}

void cudnn_attention_forward(__nv_bfloat16*, float*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                             const FlashAttentionShape&, Scratch&, cudaStream_t) {
  throw Error("cuDNN attention: " + cudnn_status().reason);
}

void cudnn_attention_backward_bf16(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                   const __nv_bfloat16*, const float*, const __nv_bfloat16*, const __nv_bfloat16*,
                                   const __nv_bfloat16*, const FlashAttentionShape&, Scratch&, cudaStream_t,
                                   const CudnnGradientStrides&) {
  throw Error("cuDNN attention: " + cudnn_status().reason);
}

#else

namespace {

// The uids the caller binds.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDout, kDq, kDk, kDv, kSoftmaxSum, kDqAccum };

constexpr cudnnDataType_t kBf16 = CUDNN_DATA_BFLOAT16;
constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// [batch, heads, seq, dim] over token-major rows of `stride` elements, heads as column blocks.
Dims rows_strides(int64_t seq, int64_t dim, int64_t stride) { return {seq * stride, dim, stride, 1}; }
// The same view as [batch, heads, dim, seq] (K^T, V^T).
Dims transposed_strides(int64_t seq, int64_t dim, int64_t stride) { return {seq * stride, dim, 1, stride}; }

struct Sizes {
  int64_t b, n, hq, hk, d;
  explicit Sizes(const FlashAttentionShape& s) : b(s.batch), n(s.q_len), hq(s.heads), hk(s.kv_heads), d(s.head_dim) {}
  Dims scores() const { return {b, hq, n, n}; }
  Dims scores_strides() const { return {hq * n * n, n * n, n, 1}; }
  Dims scores_transposed() const { return {hq * n * n, n * n, 1, n}; }
  Dims stats() const { return {b, hq, n, 1}; }
  Dims stats_strides() const { return {hq * n, n, 1, 1}; }
};

float masked_value() {
  // Before cuDNN 9.10 the fused softmax expects the lowest finite value where a score is masked.
  return cudnn_status().version < 91000 ? -3.4028234663852886e38f : -INFINITY;
}

cudnnBackendDescriptor_t score(CudnnGraph& g, const Sizes& z, cudnnDataType_t type = kF32) {
  return g.virtual_tensor(type, z.scores(), z.scores_strides());
}

// scale * Q K^T: [b, hq, n, n] fp32.
cudnnBackendDescriptor_t scaled_scores(CudnnGraph& g, const Sizes& z, cudnnBackendDescriptor_t q,
                                       cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t scale) {
  const cudnnBackendDescriptor_t s = score(g, z);
  g.matmul(q, kt, s);
  const cudnnBackendDescriptor_t scaled = score(g, z);
  g.pointwise(CUDNN_POINTWISE_MUL, scaled, s, scale);
  return scaled;
}

// Top-left causal mask: key column > query row gets the masked value.
cudnnBackendDescriptor_t causal(CudnnGraph& g, const Sizes& z, cudnnBackendDescriptor_t x) {
  const cudnnBackendDescriptor_t row = score(g, z, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, row, x, nullptr, nullptr, 2);
  const cudnnBackendDescriptor_t col = score(g, z, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, col, x, nullptr, nullptr, 3);
  const cudnnBackendDescriptor_t keep = score(g, z, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, keep, row, col, nullptr, -1, CUDNN_DATA_BOOLEAN);
  const cudnnBackendDescriptor_t masked = score(g, z);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, masked, x, g.scalar(masked_value()), keep);
  return masked;
}

float softmax_scale(const FlashAttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

// The tensors both passes take from loom: q, K^T, the output and the softmax statistics.
struct SharedTensors {
  cudnnBackendDescriptor_t q, kt, o, stats;
};
SharedTensors shared_tensors(CudnnGraph& g, const Sizes& z, const FlashAttentionShape& s) {
  return {g.tensor(kQ, kBf16, {z.b, z.hq, z.n, z.d}, rows_strides(z.n, z.d, s.q_stride)),
          g.tensor(kK, kBf16, {z.b, z.hk, z.d, z.n}, transposed_strides(z.n, z.d, s.k_stride)),
          g.tensor(kO, kBf16, {z.b, z.hq, z.n, z.d}, rows_strides(z.n, z.d, s.out_stride)),
          g.tensor(kStats, kF32, z.stats(), z.stats_strides())};
}

std::unique_ptr<CudnnGraph> forward_graph(const FlashAttentionShape& s) {
  auto g = std::make_unique<CudnnGraph>();
  const Sizes z(s);
  const auto [q, kt, o, stats] = shared_tensors(*g, z, s);
  const auto v = g->tensor(kV, kBf16, {z.b, z.hk, z.n, z.d}, rows_strides(z.n, z.d, s.v_stride));
  // One query sees its one key: the mask would remove nothing, and cuDNN up to 9.9 finds no engine
  // for a masked graph of one query (cudnn-frontend refuses it there too).
  const auto scores = scaled_scores(*g, z, q, kt, g->scalar(softmax_scale(s)));
  const auto masked = z.n == 1 ? scores : causal(*g, z, scores);
  // Softmax with its statistics: Stats = max + log(sum exp(x - max)).
  const auto max = g->virtual_tensor(kF32, z.stats(), z.stats_strides());
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  const auto shifted = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_SUB, shifted, masked, max);
  const auto e = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_EXP, e, shifted);
  const auto sum = g->virtual_tensor(kF32, z.stats(), z.stats_strides());
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const auto log_sum = g->virtual_tensor(kF32, z.stats(), z.stats_strides());
  g->pointwise(CUDNN_POINTWISE_LOG, log_sum, sum);
  g->pointwise(CUDNN_POINTWISE_ADD, stats, max, log_sum);
  // P is rounded to bf16 for P V: the fused engines take both operands of a product in one type.
  const auto p = score(*g, z, kBf16);
  g->pointwise(CUDNN_POINTWISE_DIV, p, e, sum);
  g->matmul(p, v, o);
  return g;
}

// d = einsum over the query heads of each kv head: a product per query head, then (GQA) a sum
// over the heads that share a kv head.
void per_kv_head_product(CudnnGraph& g, const Sizes& z, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                         cudnnBackendDescriptor_t out) {
  if (z.hq == z.hk) {
    g.matmul(a, b, out);
    return;
  }
  const auto full = g.virtual_tensor(kBf16, {z.b, z.hq, z.n, z.d}, {z.hq * z.n * z.d, z.n * z.d, z.d, 1});
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

// The row strides the backward writes its gradients at (packed where given as 0).
CudnnGradientStrides gradient_strides(const FlashAttentionShape& s, const CudnnGradientStrides& given) {
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  return {given.dq > 0 ? given.dq : q_width, given.dk > 0 ? given.dk : kv_width, given.dv > 0 ? given.dv : kv_width};
}

std::unique_ptr<CudnnGraph> backward_graph(const FlashAttentionShape& s, const CudnnGradientStrides& gradients) {
  auto g = std::make_unique<CudnnGraph>();
  const Sizes z(s);
  const CudnnGradientStrides rows = gradient_strides(s, gradients);
  const auto [q, kt, o, stats] = shared_tensors(*g, z, s);
  const auto vt = g->tensor(kV, kBf16, {z.b, z.hk, z.d, z.n}, transposed_strides(z.n, z.d, s.v_stride));
  const auto dout = g->tensor(kDout, kBf16, {z.b, z.hq, z.n, z.d}, rows_strides(z.n, z.d, s.out_stride));
  const auto dq = g->tensor(kDq, kBf16, {z.b, z.hq, z.n, z.d}, rows_strides(z.n, z.d, rows.dq));
  const auto dk = g->tensor(kDk, kBf16, {z.b, z.hk, z.n, z.d}, rows_strides(z.n, z.d, rows.dk));
  const auto dv = g->tensor(kDv, kBf16, {z.b, z.hk, z.n, z.d}, rows_strides(z.n, z.d, rows.dv));
  const auto scale = g->scalar(softmax_scale(s));
  // delta = rowsum(dO * O), kept in the workspace as the fused engines expect.
  const auto dout_out = g->virtual_tensor(kF32, {z.b, z.hq, z.n, z.d}, {z.hq * z.n * z.d, z.n * z.d, z.hq * z.d, 1});
  g->pointwise(CUDNN_POINTWISE_MUL, dout_out, dout, o);
  const auto row_sum = g->virtual_tensor(kF32, z.stats(), z.stats_strides());
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, dout_out, row_sum);
  const auto delta = g->tensor(kSoftmaxSum, kF32, z.stats(), z.stats_strides());
  g->pointwise(CUDNN_POINTWISE_MUL, delta, row_sum, g->scalar(1.0f));
  // P = exp(scale Q K^T - Stats), masked.
  const auto centred = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_SUB, centred, scaled_scores(*g, z, q, kt, scale), stats);
  const auto p = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_EXP, p, causal(*g, z, centred));
  // dV = P^T dO.
  const auto pt = g->virtual_tensor(kBf16, z.scores(), z.scores_transposed());
  g->reshape(p, pt);
  per_kv_head_product(*g, z, pt, dout, dv);
  // dS = scale * P * (dO V^T - delta).
  const auto dp = score(*g, z);
  g->matmul(dout, vt, dp);
  const auto dp_centred = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_SUB, dp_centred, dp, delta);
  const auto ds_unscaled = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_MUL, ds_unscaled, dp_centred, p);
  const auto ds = score(*g, z);
  g->pointwise(CUDNN_POINTWISE_MUL, ds, ds_unscaled, scale);
  // dK = dS^T Q.
  const auto dst = g->virtual_tensor(kBf16, z.scores(), z.scores_transposed());
  g->reshape(ds, dst);
  per_kv_head_product(*g, z, dst, q, dk);
  // dQ = dS K, accumulated in fp32 (workspace), then rounded into dQ.
  const auto k = g->virtual_tensor(kF32, {z.b, z.hk, z.n, z.d}, rows_strides(z.n, z.d, s.k_stride));
  g->reshape(kt, k);
  const auto dq_accum = g->tensor(kDqAccum, kF32, {z.b, z.hq, z.n, z.d}, {z.hq * z.n * z.d, z.n * z.d, z.d, 1});
  g->matmul(ds, k, dq_accum);
  g->pointwise(CUDNN_POINTWISE_IDENTITY, dq, dq_accum);
  return g;
}

struct Plan {
  std::unique_ptr<CudnnGraph> graph;
  std::string failure;
};

using PlanKey = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t>;

struct PlanCache {
  std::mutex mutex;
  std::map<PlanKey, Plan> plans;
};

Plan& plan_for(const FlashAttentionShape& s, bool backward, const CudnnGradientStrides& gradients) {
  PlanCache& cache =
      current_device_object<PlanCache>("cuDNN attention plans", [] { return std::make_unique<PlanCache>(); });
  const CudnnGradientStrides rows = backward ? gradient_strides(s, gradients) : CudnnGradientStrides{};
  const PlanKey key{backward,   s.batch,    s.q_len,      s.heads, s.kv_heads, s.head_dim, s.q_stride,
                    s.k_stride, s.v_stride, s.out_stride, rows.dq, rows.dk,    rows.dv};
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto found = cache.plans.find(key);
  if (found != cache.plans.end()) return found->second;
  Plan& plan = cache.plans[key];
  try {
    auto graph = backward ? backward_graph(s, gradients) : forward_graph(s);
    graph->build_plan(CudnnHandle(nullptr).get());
    plan.graph = std::move(graph);
  } catch (const std::exception& e) {  // a loom::Error naming cuDNN's refusal, or out of memory
    plan.failure = e.what();
    if (plan.failure.empty()) plan.failure = "the plan could not be built";
  }
  return plan;
}

CudnnGraph& ready_plan(const FlashAttentionShape& s, bool backward, const CudnnGradientStrides& gradients = {}) {
  Plan& plan = plan_for(s, backward, gradients);
  LOOM_CHECK(plan.graph != nullptr, "cuDNN attention: " + plan.failure);
  return *plan.graph;
}

void* workspace(Scratch& scratch, const CudnnGraph& graph) {
  return graph.workspace_bytes() > 0 ? scratch.bytes(graph.workspace_bytes()) : nullptr;
}

template <typename T>
void* bind(const T* p) {
  return const_cast<T*>(p);
}

}  // namespace

std::string cudnn_attention_prepare(const FlashAttentionShape& s, bool backward,
                                    const CudnnGradientStrides& gradients) {
  if (!cudnn_status().available) return "cuDNN unavailable: " + cudnn_status().reason;
  if (backward) {
    std::string why = cudnn_backward_refusal(s);
    if (!why.empty()) return why;
  }
  if (backward && (gradients.dq % 8 != 0 || gradients.dk % 8 != 0 || gradients.dv % 8 != 0))
    return "gradient row strides not multiples of 8 elements";
  return plan_for(s, backward, gradients).failure;
}

void cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, const FlashAttentionShape& s, Scratch& scratch,
                             cudaStream_t stream) {
  CudnnGraph& graph = ready_plan(s, false);
  graph.execute(CudnnHandle(stream).get(), {{kQ, bind(q)}, {kK, bind(k)}, {kV, bind(v)}, {kO, out}, {kStats, lse}},
                workspace(scratch, graph));
}

void cudnn_attention_backward_bf16(__nv_bfloat16* dq16, __nv_bfloat16* dk16, __nv_bfloat16* dv16,
                                   const __nv_bfloat16* dout, const __nv_bfloat16* out, const float* lse,
                                   const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                   const FlashAttentionShape& s, Scratch& scratch, cudaStream_t stream,
                                   const CudnnGradientStrides& gradients) {
  CudnnGraph& graph = ready_plan(s, true, gradients);
  const Sizes z(s);
  const int64_t tokens = z.b * z.n;
  float* delta = scratch.floats(z.b * z.hq * z.n);
  float* dq_accum = scratch.floats(tokens * z.hq * z.d);
  check_cuda(cudaMemsetAsync(dq_accum, 0, static_cast<size_t>(tokens * z.hq * z.d) * sizeof(float), stream),
             "cudaMemsetAsync (cuDNN attention dQ accumulator)");
  graph.execute(CudnnHandle(stream).get(),
                {{kQ, bind(q)},
                 {kK, bind(k)},
                 {kV, bind(v)},
                 {kO, bind(out)},
                 {kDout, bind(dout)},
                 {kStats, bind(lse)},
                 {kDq, dq16},
                 {kDk, dk16},
                 {kDv, dv16},
                 {kSoftmaxSum, delta},
                 {kDqAccum, dq_accum}},
                workspace(scratch, graph));
}

#endif

void cudnn_attention_backward(float* dq, float* dk, float* dv, const __nv_bfloat16* dout, const __nv_bfloat16* out,
                              const float* lse, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                              const FlashAttentionShape& s, Scratch& scratch, cudaStream_t stream) {
  const int64_t tokens = s.batch * s.q_len, q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  auto* dq16 = scratch.of<__nv_bfloat16>(tokens * q_width);
  auto* dk16 = scratch.of<__nv_bfloat16>(tokens * kv_width);
  auto* dv16 = scratch.of<__nv_bfloat16>(tokens * kv_width);
  cudnn_attention_backward_bf16(dq16, dk16, dv16, dout, out, lse, q, k, v, s, scratch, stream);
  add_bf16_rows(dq, s.q_stride, dq16, q_width, tokens, q_width, stream);
  add_bf16_rows(dk, s.k_stride, dk16, kv_width, tokens, kv_width, stream);
  add_bf16_rows(dv, s.v_stride, dv16, kv_width, tokens, kv_width, stream);
}

}  // namespace loom::kernels::cuda
