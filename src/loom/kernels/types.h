#pragma once
// Types and constants shared by every kernel backend and their callers: the AdamW step's
// hyper-parameters, attention's shapes and visibility, RoPE's tables, the ignored target id. The backends'
// headers (cpu/, cuda/) and the device-neutral entries (ops.h) all use these.
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace loom::kernels {

constexpr int32_t kIgnoreIndex = -1;  // targets equal to this are masked out (no loss, no gradient)

struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;             // 1-based, for bias correction
  float grad_scale = 1.0f;  // gradients are multiplied by this first (clipping, fused)
};

// What the update of a per-tensor FP8 linear layer's weight [rows, cols] also writes for its next
// products, from each value it updates (model/optimizer_weight_casts.h): into `amax` (a device
// float the caller zeroed) max |value| (NaN wins, as every amax), and, where `forward` is set, the
// values cast to E4M3 under `scale` into both of the weight's stores, each with its scale pair
// (kernels/precision_gemm.h's weight_cast_layout): `forward` [rows, cols], `transposed` (dgrad's)
// [cols, rows]. The same codes and amax as the casts a forward makes of the weight.
struct AdamWFp8Weight {
  float* amax = nullptr;
  void* forward = nullptr;
  void* transposed = nullptr;
  int64_t rows = 0, cols = 0;
  float scale = 1.0f;
};

// A run of n floats from `begin` (in elements) of a buffer (zero_runs).
struct FloatRun {
  int64_t begin = 0, n = 0;
};

// The distinct steps one adamw_update_many call may take (its tensors' learning rates and weight
// decays: a model's decayed weights and undecayed norms and biases, scaled learning rates).
constexpr int kMaxAdamWSteps = 8;

// One tensor of a multi-tensor AdamW update (adamw_update_many): n elements of each array, updated
// with the call's steps[step_index].
// `param_bf16` (2-byte elements; null: none): also receives each updated parameter rounded to
// bf16 (nearest even), the copy a bf16 model's GEMMs multiply, written by the pass that updates it.
// `fp8`: an FP8 weight's amax and codes, written by that pass too (rows * cols == n where set).
struct AdamWTensor {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  void* param_bf16 = nullptr;
  AdamWFp8Weight fp8{};
  int step_index = 0;
};

// What attention's products take: fp32 values, or q, k, v (and forward's out, backward's out and
// dout) rounded to bf16, as tensor cores take them. lse, the merge of partial results and the
// gradients stay fp32 either way. On the CPU the bf16 form rounds copies and runs the fp32 kernel
// (cpu/attention_bf16.h); on a GPU it casts them and runs the tensor-core kernels.
enum class AttentionOperands : uint8_t { Fp32, Bf16 };

struct AttentionShape {
  int64_t batch, seq, heads, kv_heads, head_dim;
  AttentionOperands operands = AttentionOperands::Fp32;
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// The elements of a paged KV cache's pools: fp32, or bf16 (written rounded to nearest even,
// widened exactly where attention reads them: half the bytes per position).
enum class KvCacheDtype : uint8_t { Fp32, Bf16 };
constexpr std::array<std::string_view, 2> names(KvCacheDtype) { return {"fp32", "bf16"}; }  // config::name_of
inline int64_t kv_cache_element_bytes(KvCacheDtype dtype) { return dtype == KvCacheDtype::Bf16 ? 2 : 4; }

// A paged KV cache's geometry (see cpu/paged_attention.h): heads of this rank, positions per
// block, entries per sequence's block table, and the pools' elements.
struct PagedAttentionShape {
  int64_t heads, kv_heads, head_dim, block_size, table_width;
  KvCacheDtype cache = KvCacheDtype::Fp32;
};
// Prompt rows attended together (paged_prompt_attention, ops.h): at most this many rows of one
// table entry per tile.
inline constexpr int64_t kPromptTileRows = 64;

// Tiled (flash-style) attention: q [batch, q_len] tokens, k and v [batch, k_len] tokens; head h of
// token i of row b starts at q + (b * q_len + i) * q_stride + h * head_dim (likewise k, v with
// kv head h / (heads / kv_heads), and out, dout with out_stride). The strides are in floats, so q,
// k and v may be column ranges of one fused qkv activation; dq, dk, dv share q, k, v's strides.
struct FlashAttentionShape {
  int64_t batch, q_len, k_len, heads, kv_heads, head_dim;
  int64_t q_stride, k_stride, v_stride, out_stride;
  AttentionOperands operands = AttentionOperands::Fp32;
};

// Which keys a query sees, from per-token metadata: q_* are [batch, q_len], k_* [batch, k_len].
// Key j is visible to query i of the same row iff doc(i) == doc(j) and pos(j) <= pos(i). Positions
// are each token's index in its row's full sequence order (for causality; not RoPE positions), so
// a block of keys or a reordered chunk of queries (context parallelism) keeps its meaning. A null
// position array means the token's index in this call (0, 1, ...); null documents mean one
// document per row.
struct AttentionVisibility {
  const int32_t* q_pos = nullptr;
  const int32_t* k_pos = nullptr;
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;
};

// How RoPE's frequencies are rescaled for contexts longer than pre-training's, as Hugging Face's
// rope_scaling: Llama 3.1's rule (rope_type "llama3") or YaRN (rope_type "yarn").
struct RopeScaling {
  enum class Type : uint8_t { None, Llama3, Yarn };
  Type type = Type::None;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double original_max_positions = 8192.0;                // llama3, yarn
  double beta_fast = 32.0, beta_slow = 1.0;              // yarn
};

// RoPE's inverse frequencies theta^(-2i/head_dim), i < head_dim/2, rescaled per `scaling`.
std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& scaling);
// The factor cos and sin are multiplied by: YaRN's 0.1 ln(factor) + 1 (factor > 1), else 1.
double rope_attention_factor(const RopeScaling& scaling);

// The MLP's activations, for the entries that take them by name (activation_forward_bf16).
enum class MlpActivation : uint8_t { Swiglu, Gelu, Relu2 };

// A mixture-of-experts router's scores and combine weights (config::MoeRouter; model/moe_router.h):
// topk_softmax: softmax over the k selected logits; softmax_topk: softmax over every expert, at
// the k selected; sigmoid: the selected sigmoid scores normalised over them. Each weight is times
// topk_scaling.
enum class RouterKind : uint8_t { TopkSoftmax, SoftmaxTopk, Sigmoid };

// A router's kind, experts, selections per token and weight scaling over `tokens` tokens: what its
// forward and backward (RouterForward, RouterBackward) share.
struct RouterShape {
  RouterKind kind = RouterKind::TopkSoftmax;
  int experts = 0, top_k = 0;
  float topk_scaling = 1.0f;
  int64_t tokens = 0;
};

// What moe_router_forward reads and writes, every array on the device of the call. Per token
// t < tokens, from its logits [E] and their scores: its k selected experts (`expert` [tokens, k],
// largest first, ties to the lower index) of the values selected on (the logits under
// topk_softmax, else the scores; plus `bias` [E] where set, for selection only) and their combine
// weights (`weight` [tokens, k], times topk_scaling); where set, its logits' log-sum-exp (`lse`
// [tokens], the z-loss's) and, per group of group_tokens tokens, the sum of its tokens' scores
// normalised per token (`prob_sums` [groups, E], the balancing loss's P; the sigmoid scores over
// their sum, the softmax as they are).
struct RouterForward : RouterShape {
  const float* logits = nullptr;
  const float* bias = nullptr;
  int32_t* expert = nullptr;
  float* weight = nullptr;
  double* lse = nullptr;
  double* prob_sums = nullptr;
  int64_t group_tokens = 0;
};

// What moe_router_backward reads, every array on the device of the call. Per token t < tokens:
// its logits [E] (the scores recomputed from them), its k selected experts and their combine
// weights, and the gradient of the loss with respect to each weight: selection t * k + i was
// dispatched as row selection_row[t * k + i] (-1: dropped, no gradient), whose gradient is
// float(row_grad[that row]). The losses' gradients only for tokens [first, end) (the rows a rank
// owns under sequence parallelism), scaled by aux_scale: the balancing loss's where aux_f is set
// (groups of group_tokens tokens, factor aux_factor[g], selection counts aux_f [groups, E]), and the
// z-loss's where z_loss_coeff > 0 (over `tokens` tokens).
struct RouterBackward : RouterShape {
  const float* logits = nullptr;
  const int32_t* expert = nullptr;
  const float* weight = nullptr;
  const int32_t* selection_row = nullptr;
  const double* row_grad = nullptr;
  const float* aux_f = nullptr;
  const double* aux_factor = nullptr;
  int64_t group_tokens = 0;
  double z_loss_coeff = 0.0;
  float aux_scale = 1.0f;
  int64_t first = 0, end = 0;
};

// cos/sin tables [max_positions, head_dim/2] for those frequencies, times the attention factor
// (host memory; a device backend mirrors them). Never changed once made: a device keeps its copy
// by `id`, a number no other table made in the process has, so a call finds it without comparing
// the values.
struct RopeTable {
  RopeTable(int64_t max_positions, int64_t head_dim, double theta, const RopeScaling& scaling = {});
  int64_t head_dim;
  std::vector<float> cos, sin;
  uint64_t id;
};

// The RoPE an attention backward undoes on its q and k gradients before rounding them
// (kernels::flash_attention_backward_bf16_gradients): none when `table` is null; rows are [batch,
// seq] and row r's position is positions[r] when given (packed documents, device memory), else
// r % seq, as rope_backward's with positions_start 0.
struct QkvRotation {
  const RopeTable* table = nullptr;
  int64_t seq = 0;
  const int32_t* positions = nullptr;
};

}  // namespace loom::kernels

namespace loom::kernels {

// Mamba-2's state-space scan (SSD) over [batch, seq] tokens with `heads` heads of head_dim
// channels sharing B and C within `groups` groups (head h uses group h / (heads / groups)), state
// size `state`. Token r = b * seq + t: x at x + r * x_stride + h * head_dim, raw dt at
// dt + r * dt_stride + h, B and C at B / C + r * bc_stride + g * state, y at y + r * y_stride +
// h * head_dim; gradients share their operand's stride. `chunk`: tokens per block of the chunked
// scan (quadratic inside a block, the state passed between blocks).
struct SsdShape {
  int64_t batch, seq, heads, head_dim, groups, state, chunk;
  int64_t x_stride, dt_stride, bc_stride, y_stride;
};

// Mamba's causal depthwise convolution over [batch, seq] tokens: `channels` channels, `kernel`
// taps; input / output rows in_stride / out_stride floats apart.
struct ConvShape {
  int64_t batch, seq, channels, kernel, in_stride, out_stride;
};

}  // namespace loom::kernels
