#pragma once
// The device-neutral kernel entries: one function per op, forward and backward, each taking the
// device its pointers live on first. On the CPU each calls kernels::cpu (same contracts, see
// cpu/*.h); on a GPU the kernel from kernels/cuda where one is registered (cuda_entries.h), else
// it throws loom::Error naming the op. Dispatch is one branch, no allocation. Model, precision,
// optimizer and training code call these, never a backend directly.
//
// Conventions of every backend: backward kernels add into their gradient outputs; cross-entropy
// overwrites the logits with their gradient (docs/architecture.md, "Kernels").
#include <cstdint>
#include <span>

#include "loom/core/device.h"
#include "loom/core/dtype.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/types.h"

namespace loom::kernels {

// --- embedding: out[r, :] = table[ids[r], :] (+= with accumulate); backward adds into dtable.
void embedding_forward(Device device, float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                       bool accumulate);
void embedding_backward(Device device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                        int64_t dim);
// Vocabulary-parallel: `table` holds ids [first_id, first_id + count).
void embedding_forward_shard(Device device, float* out, const int32_t* ids, const float* table, int64_t rows,
                             int64_t dim, int64_t first_id, int64_t count);
void embedding_backward_shard(Device device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                              int64_t dim, int64_t first_id, int64_t count);

// --- norms over the last dimension; forward saves per-row statistics for backward.
void rmsnorm_forward(Device device, float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t dim, float eps);
// The backwards add into din; `din16`, when given, receives din's values after the add rounded to
// bf16 (2-byte elements, nearest even): the residual gradient a bf16 projection's GEMMs read next
// (model::ResidualGradForReader), written by the pass that writes din rather than cast from it by
// another. `din_amax`, when given, takes the max |value| of din after the add as amax_into takes it
// (*din_amax >= 0 or NaN): the amax fp8_current's cast of that gradient needs first, without a
// pass over din of its own.
void rmsnorm_backward(Device device, float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t dim, void* din16 = nullptr,
                      float* din_amax = nullptr);
void layernorm_forward(Device device, float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t dim, float eps);
void layernorm_backward(Device device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16 = nullptr, float* din_amax = nullptr);
// The forwards with the output in bf16 (out16, 2-byte elements): each value computed in fp32 as the
// fp32 form computes it and rounded to bf16 as it is stored (what a bf16 projection casts the fp32
// form's output to); the statistics as the fp32 form saves them.
void rmsnorm_forward_bf16(Device device, void* out16, float* rstd, const float* in, const float* weight,
                          int64_t rows, int64_t dim, float eps);
void layernorm_forward_bf16(Device device, void* out16, float* mean, float* rstd, const float* in,
                            const float* weight, const float* bias, int64_t rows, int64_t dim, float eps);
// A residual add and the norm after it in one pass: sum = residual + add16 (fp32 [rows, dim], the
// residual stream's next tensor; add16 a bf16 product, rounded with its bias, widened exactly and
// added with one rounding, as a product's own add into the stream adds it), then the bf16 forward
// of sum as rmsnorm_forward_bf16 / layernorm_forward_bf16 computes it: the same values as the two
// apart, without reading the stream back (on a GPU bit for bit where residual and add16 are
// 16-byte aligned whenever sum is, as the model's buffers all are: else the rows are read element
// by element and summed in another order). sum may not alias residual.
void rmsnorm_add_forward_bf16(Device device, void* out16, float* rstd, float* sum, const float* residual,
                              const void* add16, const float* weight, int64_t rows, int64_t dim, float eps);
void layernorm_add_forward_bf16(Device device, void* out16, float* mean, float* rstd, float* sum,
                                const float* residual, const void* add16, const float* weight, const float* bias,
                                int64_t rows, int64_t dim, float eps);
// The backwards over a bf16 output gradient (dout16, 2-byte elements: a bf16 projection's input
// gradient, rounded to bf16 anyway): the fp32 backward on its values widened, bit for bit.
void rmsnorm_backward_bf16(Device device, float* din, float* dweight, const void* dout16, const float* in,
                           const float* weight, const float* rstd, int64_t rows, int64_t dim, void* din16 = nullptr,
                           float* din_amax = nullptr);
void layernorm_backward_bf16(Device device, float* din, float* dweight, float* dbias, const void* dout16,
                             const float* in, const float* weight, const float* mean, const float* rstd, int64_t rows,
                             int64_t dim, void* din16 = nullptr, float* din_amax = nullptr);

// --- rotary position embedding, in place on `heads` heads from column first_col of each row.
// Row r's position is positions[r] when `positions` is given (packed documents restart at 0),
// else positions_start + r % seq.
void rope_forward(Device device, float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                  int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions = nullptr);
void rope_backward(Device device, float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                   int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions = nullptr);
// rope_forward on a bf16 tensor x16 (row_stride in elements, 2 bytes each): each rotated value
// computed in fp32 as rope_forward computes it from the widened values, rounded to bf16 as it is
// stored (what the fp32 path's attention casts the rotated q and k to).
void rope_forward_bf16(Device device, void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                       int64_t seq, int64_t positions_start, const RopeTable& table,
                       const int32_t* positions = nullptr);

// --- MLP activations. SwiGLU reads fused [gate | up] rows (2 * width). Their backwards write
// the input gradient (every element), unlike most backwards here, which add: its only reader is
// the next GEMM, so no zeroing pass over the MLP's widest activation is needed.
void swiglu_forward(Device device, float* out, const float* gate_up, int64_t rows, int64_t width);
void swiglu_backward(Device device, float* dgate_up, const float* dout, const float* gate_up, int64_t rows,
                     int64_t width);
void gelu_forward(Device device, float* out, const float* in, int64_t n);
void gelu_backward(Device device, float* din, const float* dout, const float* in, int64_t n);
void relu2_forward(Device device, float* out, const float* in, int64_t n);
void relu2_backward(Device device, float* din, const float* dout, const float* in, int64_t n);
// The MLP's activation over bf16 tensors (2-byte elements: the bf16 recipe's MLP interior on a
// device, Mlp::bf16_interior): the fp32 kernels' arithmetic on the widened values, each output
// rounded to bf16 (nearest even) as it is stored, so round() of the fp32 kernels' outputs. in16:
// [rows, 2 width] for SwiGLU's [gate | up], else [rows, width]; out16 and dout16 [rows, width].
// Forward writes out in fp32 (the fp32 kernels' outputs unrounded: an FP8 block's activation,
// which its down projection casts to FP8 itself), or out16 in bf16 when out is null; backward
// writes din whole in fp32, or din16 in bf16 when din is null, and adds into dbias (when not
// null) the column sums of the fp32 input gradient over the rows, in kernels/column_sums.h's
// order as linear_backward's bias gradient: an up projection's bias gradient from the unrounded
// hidden gradient, whichever form din takes. With `amax` (not null), each also takes the max |v|
// of what it writes (out or out16; din or din16) into *amax as amax_into does (*amax >= 0 or NaN;
// NaN wins): a per-tensor FP8 cast of that output then needs no pass of its own to find it. With
// neither output (out and out16, din and din16 null; no dbias), only that amax, of the fp32 values:
// the pass before activation_forward_codes / activation_backward_codes that fp8_current's scale
// needs (from the values they cast).
void activation_forward_bf16(Device device, MlpActivation activation, float* out, void* out16, const void* in16,
                             int64_t rows, int64_t width, float* amax = nullptr);
void activation_backward_bf16(Device device, MlpActivation activation, float* din, void* din16, float* dbias,
                              const void* dout16, const void* in16, int64_t rows, int64_t width,
                              float* amax = nullptr);
// y[r * y_stride + c] += x[r * x_stride + c] for r < rows, c < width: a column block added into
// another (kernels/cpu/rows.h).
void add_rows(Device device, float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width);
// Rows moved by index with a per-row scale, and per-row dot products in double (cpu/rows.h):
// a mixture-of-experts layer's dispatch, combine and gates (a negative gather index: a row of
// zeros, the experts' padding). Index and scale arrays (may be null) live on `device`.
void gather_rows(Device device, float* out, const float* x, const int32_t* index, const float* scale, int64_t rows,
                 int64_t width);
void scatter_add_rows(Device device, float* out, const float* x, int64_t x_stride, const int32_t* index,
                      const float* scale, int64_t rows, int64_t width);
void row_dots(Device device, double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride,
              int64_t rows, int64_t width);
// A gated shared expert's gate (Qwen2-MoE's shared_expert_gate) from its logits, row dots in
// double: gate[t] = float(1 / (1 + exp(-logit[t]))); and the logits' gradient from the gated output's
// row dots with its gradient: d_logit[t] = float(dot[t]) * gate[t] * (1 - gate[t]) in float.
void sigmoid_gate(Device device, float* gate, const double* logits, int64_t n);
void sigmoid_gate_backward(Device device, float* d_logit, const double* dots, const float* gate, int64_t n);
// A mixture-of-experts router's selections, combine weights and the losses' sums from its logits
// (RouterForward, kernels/types.h), where the logits are: the host reads back [tokens, k] selections
// and weights rather than [tokens, E] logits.
void moe_router_forward(Device device, const RouterForward& r);
// A mixture-of-experts router's backward (RouterBackward, kernels/types.h): d_logits [tokens, E]
// written whole, where the router's logits live, so the layer's backward reads nothing back.
void moe_router_backward(Device device, float* d_logits, const RouterBackward& r);

// --- linear layers (W stored [out, in]) and a plain GEMM.
void linear_forward(Device device, float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate = false);
// din (+)= dout . W (written whole unless `accumulate_din`); dweight (+)= dout^T . in (written
// whole unless `accumulate_dweight`); dbias += the column sums of dout; any of the three may be
// null (cpu/linear.h).
void linear_backward(Device device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                     bool accumulate_din = true, bool accumulate_dweight = true);
// x[rows, width] += bias on every row: a row-parallel linear's bias, added once to the sum of the
// ranks' partial products (model/tensor_parallel.h).
void add_bias(Device device, float* x, const float* bias, int64_t rows, int64_t width);
void gemm_nt(Device device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
             bool accumulate);
// c[m, n] (+)= op(a) . op(b) with op = transpose when asked (a stored [k, m] when trans_a, b [n, k]
// when trans_b).
void gemm(Device device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
          bool trans_b, bool accumulate);

// --- attention. Training uses the tiled flash-style kernel (memory linear in the sequence):
// forward saves out and the log-sum-exp lse [batch, heads, q_len] (fp32; a query that sees no key
// gets out = 0, lse = -inf); backward adds into dq, dk, dv and accepts the final out/lse merged
// over several key blocks (context parallelism calls it per block). Shapes and visibility, and
// the strides that let q, k, v be views of one fused qkv: kernels/types.h.
void flash_attention_forward(Device device, float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionShape& s, const AttentionVisibility& vis);
void flash_attention_backward(Device device, float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const FlashAttentionShape& s, const AttentionVisibility& vis);
// The same under AttentionOperands::Bf16 with q, k, v, the output (forward) and the output's
// gradient (backward) as bf16 tensors in the shape's layout (strides in elements, 2 bytes each):
// the values the entries above cast to bf16 for the bf16 kernels or widen from them, so the
// results are the same, without those passes (Attention::bf16_tensors). lse and the gradients
// dq, dk, dv stay fp32.
void flash_attention_forward_bf16_tensors(Device device, void* out16, float* lse, const void* q16, const void* k16,
                                          const void* v16, const FlashAttentionShape& s,
                                          const AttentionVisibility& vis);
void flash_attention_backward_bf16_tensors(Device device, float* dq, float* dk, float* dv, const void* dout16,
                                           const void* out16, const float* lse, const void* q16, const void* k16,
                                           const void* v16, const FlashAttentionShape& s,
                                           const AttentionVisibility& vis);
// The same with the gradients written whole in bf16 (dq16, dk16, dv16: 2-byte views in the layout
// of q, k, v): what the entry above adds into zeroed fp32 gradients, rounded to nearest even (the
// bf16 recipe's q/k/v projection casts its output gradient to bf16 anyway).
// With dbias_q, dbias_k, dbias_v (not null), each view's fp32 gradient's column sums are added
// into them in kernels/column_sums.h's order: the fused projection's bias gradient, as
// linear_backward would sum it from the fp32 gradients. With a `rotation` (no bias sums then), the
// q and k gradients are first rotated back as rope_backward rotates the fp32 ones, then rounded.
void flash_attention_backward_bf16_gradients(Device device, void* dq16, void* dk16, void* dv16, float* dbias_q,
                                             float* dbias_k, float* dbias_v, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation = {});
// The same gradients written whole in fp32 into dq, dk, dv (q's, k's and v's layout; nothing
// beside the views is touched), with a `rotation` RoPE undone on the q and k gradients as
// rope_backward undoes it: what flash_attention_backward_bf16_tensors adds into zeroed gradients,
// rotated back after, bit for bit, without the zeroing, the add and the rotation's pass (the q/k/v
// gradient that per-tensor FP8's projection casts from its fp32 values). With `amax` (not null),
// the max |value| of the three views as written is taken into *amax as amax_into takes it
// (fp8_current's scale for that cast, with no pass over the gradient first).
void flash_attention_backward_fp32_gradients(Device device, float* dq, float* dk, float* dv, const void* dout16,
                                             const void* out16, const float* lse, const void* q16, const void* k16,
                                             const void* v16, const FlashAttentionShape& s,
                                             const AttentionVisibility& vis, const QkvRotation& rotation = {},
                                             float* amax = nullptr);
// Folds a partial (out, lse) over another block of keys into the running one (fp32).
void merge_attention_partials(Device device, float* out, float* lse, const float* part_out, const float* part_lse,
                              const FlashAttentionShape& s);
// The materialising kernel (probs [batch, heads, seq, seq], causal, one document per row): kept
// only as the reference of tests and benchmarks.
void reference_attention_forward(Device device, float* out, float* probs, const float* qkv, const AttentionShape& s);
void reference_attention_backward(Device device, float* dqkv, const float* dout, const float* probs,
                                  const float* qkv, const AttentionShape& s);
// KV-cache decoding of new_tokens queries of one sequence at positions [past, past + new_tokens).
void attention_decode(Device device, float* out, const float* q, int64_t q_stride, const float* k_cache,
                      const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads,
                      int64_t head_dim);
// Batched attention over a paged KV cache (per-row sequence and position; cpu/paged_attention.h).
// The pools hold shape.cache's elements (fp32 or bf16).
void paged_attention(Device device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                     const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                     const int32_t* positions, int64_t rows, const PagedAttentionShape& shape);
// Prompt rows in tiles of one sequence each (cpu/paged_attention.h). On the CPU each tile's rows
// are paged_attention's exact fp32 result; on a GPU, which serves only what
// paged_prompt_attention_on_tensor_cores accepts (a bf16 pool, head_dim 64 or 128; anything else
// is an Error saying so), on tensor cores: queries and probabilities rounded to bf16, the rows'
// results independent of their tile-mates (cuda/paged_prompt_attention.h).
bool paged_prompt_attention_on_tensor_cores(Device device, const PagedAttentionShape& shape, int64_t q_stride);
void paged_prompt_attention(Device device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                            const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                            const int32_t* positions, const int32_t* tiles, int64_t tile_count, int64_t reach,
                            const PagedAttentionShape& shape);
// The rows' keys and values stored in the paged cache at their positions (cpu/paged_attention.h).
void paged_cache_write(Device device, void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& shape);

// --- Mamba-2 (contracts: cpu/ssd_scan.h, cpu/causal_conv.h, cpu/gated_norm.h). The chunked
// state-space scan with softplus(dt + dt_bias) and A = -exp(A_log) folded in; backward adds into
// every gradient. Documents restart the state (null = one document per row). The step entries
// continue each sequence by s.seq tokens from its state / window: one while decoding, a prompt's
// chunk at once while prefilling.
void ssd_scan_forward(Device device, float* y, const float* x, const float* dt_raw, const float* dt_bias,
                      const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                      const int32_t* documents);
void ssd_scan_backward(Device device, float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB,
                       float* dC, float* dD, const float* dy, const float* x, const float* dt_raw,
                       const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                       const SsdShape& s, const int32_t* documents);
// `slots` (null: row b's state is the b-th of `state`): row b's state is the slots[b]-th of the
// pool `state` (one token per row: decoding sequences whose states are a pool's slots, one call).
void ssd_scan_step(Device device, float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s);
// Short causal depthwise convolution + SiLU, its window restarting at document starts.
void causal_conv_silu_forward(Device device, float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents);
void causal_conv_silu_backward(Device device, float* din, float* dweight, float* dbias, const float* dout,
                               const float* in, const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents);
void causal_conv_silu_step(Device device, float* out, float* window, const int32_t* slots, const float* in,
                           const float* weight, const float* bias, const ConvShape& s);
// Gated RMSNorm over groups: norm(y * silu(z)) * weight.
void gated_rmsnorm_forward(Device device, float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                           const float* weight, int64_t rows, int64_t dim, int64_t group_size, float eps);
void gated_rmsnorm_backward(Device device, float* dy, float* dz, float* dweight, const float* dout, const float* y,
                            const float* z, int64_t z_stride, const float* weight, const float* rstd, int64_t rows,
                            int64_t dim, int64_t group_size);

// --- softmax cross-entropy fused with its backward; returns the sum of losses (double).
double softmax_cross_entropy(Device device, float* logits, float* losses, const int32_t* targets, int64_t rows,
                             int64_t vocab, float grad_scale);
// The same over bf16 logits (2-byte elements: a linear head's bf16 output on a device), replaced by
// grad_scale * d(loss)/d(logits) rounded to bf16 (nearest even) unless grad_scale is 0: computed
// in fp32 as softmax_cross_entropy computes, so the same losses and round() of its gradient.
double softmax_cross_entropy_bf16(Device device, void* logits, float* losses, const int32_t* targets, int64_t rows,
                                  int64_t vocab, float grad_scale);
// Vocabulary-parallel pieces: row_max -> all-reduce max -> exp_sums -> all-reduce sum -> finish.
void vocab_shard_row_max(Device device, const float* logits, int64_t rows, int64_t vocab_shard, float* row_max);
void vocab_shard_exp_sums(Device device, const float* logits, const float* row_max, const int32_t* targets,
                          int64_t rows, int64_t vocab_shard, int64_t first_id, float* stats);
double vocab_shard_finish(Device device, float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale);
// A per-token objective's gradient: row_scale[r] * (softmax - onehot) per row (cpu/vocab_parallel_cross_entropy.h).
void vocab_shard_gradient(Device device, float* logits, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          const float* row_scale);

// --- optimizer: fused AdamW, the sum of squares for global-norm clipping, scaling.
void adamw_update(Device device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step);
// Many tensors in one pass (one launch on a GPU, per kMaxTensorsPerLaunch of them); the same result
// as adamw_update on each with its step, steps[t.step_index] (at most kMaxAdamWSteps steps).
void adamw_update_many(Device device, std::span<const AdamWTensor> tensors, std::span<const AdamWStep> steps);
inline void adamw_update_many(Device device, std::span<const AdamWTensor> tensors, const AdamWStep& step) {
  adamw_update_many(device, tensors, std::span<const AdamWStep>(&step, 1));
}
// base[r.begin, r.begin + r.n) = 0 for every run (on a GPU one launch per 128 small runs, a memset
// per run of more than 64K floats): a gradient buffer zeroed around the ranges its GEMMs write
// whole (model/parameters.h).
void zero_runs(Device device, float* base, std::span<const FloatRun> runs);
// Starts (start) or stops the device's profiler capture (cudaProfilerStart / cudaProfilerStop on a
// GPU, for a profiler attached to the process); nothing on the cpu.
void device_profiler_capture(Device device, bool start);
// sum(x^2), each square exact in fp64 and summed there: Inf or NaN exactly when some x[i] is (no
// finite square overflows fp64), which makes the gradient norm the check before a step too.
double sum_of_squares(Device device, const float* x, int64_t n);
void scale_in_place(Device device, float* x, int64_t n, float factor);
// y += x (ZeRO's reduced gradient shards accumulating over micro-batches).
void add_in_place(Device device, float* y, const float* x, int64_t n);
// DiLoCo's outer update of n elements (kernels/cpu/adamw.h): momentum and anchor updated from the
// sites' averaged delta with Nesterov momentum, the same fused multiply-adds on every device.
void nesterov_outer_update(Device device, float* anchor, float* momentum, const float* delta, int64_t n, float lr,
                           float mu);
// *dst = max(*dst, max |x[0, n)|) where the tensors live, nothing read back: the FP8 recipes'
// amaxes stay on the device. *dst must be >= 0 or NaN; a NaN or Inf stays (NaN wins over Inf).
void amax_into(Device device, float* dst, const float* x, int64_t n);
// The same over a bf16 tensor x16 (2-byte elements): an FP8 operand kept bf16 (Attention::bf16_tensors).
void amax_into_bf16(Device device, float* dst, const void* x16, int64_t n);

// --- 16-bit copies of fp32 arrays (bf16 gradients on the data-parallel wire). dtype: BF16 or F16.
// narrow: dst[i] = src[i] rounded to nearest even. widen: dst[i] = f32(src[i]), or += when
// accumulating (micro-batches' reduced gradient shards).
void narrow_floats(Device device, void* dst, const float* src, int64_t n, DType dtype);
void widen_floats(Device device, float* dst, const void* src, int64_t n, DType dtype, bool accumulate);

// --- the precision recipes' linear GEMMs on a GPU (precision_gemm.h). Device entries only: the
// CPU emulates the recipes in fp32 (model/linear_precision.cpp), so on the CPU these throw.
// max |x| (NaN or Inf when one is there), read back to the host (a synchronisation: the GEMMs
// do not use it). round_in_place: x rounded to the dtype and widened back (None: unchanged).
float amax(Device device, const float* x, int64_t n);
void round_in_place(Device device, float* x, int64_t n, OutputRounding rounding);
void precision_linear_gemm(Device device, const PrecisionGemm& gemm);
// count independent GEMMs (none reads what another writes; an MoE layer's experts' GEMMs of one
// kind), each computing what precision_linear_gemm computes of it: on a GPU the groupable ones
// (precision_gemm.h) as one grouped product per output type where they are many and small
// (kernels/cuda/grouped_gemm.h), the others one by one.
void precision_linear_gemms(Device device, const PrecisionGemm* gemms, int64_t count);
// Per-tensor FP8: the MLP activation's output (forward) or its input gradient (backward) cast
// straight to FP8 codes from what the activation reads (in16, and dout16 backward, as
// activation_forward_bf16 / activation_backward_bf16 take them), with no fp32 tensor between: the
// codes of the values those would store in fp32, cast as `cast` (Fp8Tensor) says: fp8_delayed's
// host scale, or fp8_current's from the device amax cast.amax with cast.margin, which the caller
// took first (activation_*_bf16 given no output); fp8_delayed's pending amax is taken by the same
// pass that casts (cast.amax_out, as a precision GEMM's casts take it: no pass first). `codes`
// receives the [rows, cols] codes and `transposed` the [cols, rows] ones (cols: width forward, the
// input width backward), each followed by the scale and its inverse,
// kept_operand_bytes(Fp8Tensor, rows, cols) bytes each: what a GEMM takes as
// PrecisionGemm::a_codes, and as input_codes or a_store for the weight gradient.
void activation_forward_codes(Device device, MlpActivation activation, const void* in16, int64_t rows, int64_t width,
                              const CastOperand& cast, void* codes, void* transposed);
void activation_backward_codes(Device device, MlpActivation activation, const void* dout16, const void* in16,
                               int64_t rows, int64_t width, const CastOperand& cast, void* codes, void* transposed);
// Per-tensor FP8: a norm's output cast straight to FP8 codes from the norm's input, with no fp32
// output between (the norms before an FP8 block's q/k/v and up projections). norm_statistics
// writes each row's statistics as rmsnorm_forward / layernorm_forward save them (mean null:
// RMSNorm, bias unused; else LayerNorm's mean too) and, given `amax`, takes the max |output| into
// it (amax_into's contract: fp8_current's scale needs it first), the outputs themselves not
// written. norm_forward_codes casts the outputs those would write, evaluated from the input, the
// statistics and the weights, into codes and transposed codes as activation_forward_codes does
// (cols = dim).
void norm_statistics(Device device, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                     int64_t rows, int64_t dim, float eps, float* amax);
void norm_forward_codes(Device device, const float* in, const float* weight, const float* bias, const float* mean,
                        const float* rstd, int64_t rows, int64_t dim, const CastOperand& cast, void* codes,
                        void* transposed);

}  // namespace loom::kernels
