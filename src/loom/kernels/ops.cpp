#include "loom/kernels/ops.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/adamw.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/attention_bf16.h"
#include "loom/kernels/cpu/causal_conv.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/amax.h"
#include "loom/kernels/cpu/flash_attention.h"
#include "loom/kernels/cpu/gated_norm.h"
#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/norm.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/kernels/cpu/rope.h"
#include "loom/kernels/cpu/moe_router.h"
#include "loom/kernels/cpu/rows.h"
#include "loom/kernels/cpu/ssd_scan.h"
#include "loom/kernels/cpu/vocab_parallel_cross_entropy.h"
#include "loom/kernels/cuda_entries.h"

// Every entry: `if (device.is_cpu())` the CPU kernel, else the registered CUDA kernel or an error.
// The error paths are out of line so the CPU path stays one predictable branch.

namespace loom::kernels {

CudaEntries& cuda_entries() {
  static CudaEntries entries;
  return entries;
}

namespace {
std::atomic<CudaStarter> g_cuda_starter{nullptr};
std::mutex g_cuda_start;
}  // namespace

void set_cuda_starter(CudaStarter starter) { g_cuda_starter.store(starter); }

int start_cuda() {
  std::lock_guard<std::mutex> lock(g_cuda_start);  // ranks as threads start it together
  if (!cuda_entries().started) {
    const CudaStarter starter = g_cuda_starter.load();
    LOOM_CHECK(starter != nullptr, "this loom was built without the CUDA backend (no nvcc when it was configured; "
                                   "see docs/cuda.md): it runs on the cpu only");
    starter();
  }
  return cuda_entries().devices;
}

namespace {

[[noreturn]] [[gnu::cold]] void no_kernel(const char* op, Device device) {
  if (device.is_cuda() && !cuda_entries().started) {
    throw Error(std::string("kernels::") + op + " on " + device.name() +
                ": the CUDA backend is not started (or this build has none)");
  }
  throw Error(std::string("kernels::") + op + " has no CUDA kernel yet (asked to run on " + device.name() + ")");
}

// The registered CUDA kernel, or the error naming the op.
template <typename F>
F cuda_kernel(F kernel, const char* op, Device device) {
  if (kernel == nullptr) [[unlikely]] no_kernel(op, device);
  return kernel;
}

}  // namespace

#define LOOM_CPU_ONLY(op, ...)                      \
  if (device.is_cpu()) [[likely]]                   \
    return cpu::op(__VA_ARGS__);                    \
  no_kernel(#op, device)

// The CPU kernel, or the CUDA kernel registered for the op (same arguments after the device).
#define LOOM_DISPATCH(op, ...)                      \
  if (device.is_cpu()) [[likely]]                   \
    return cpu::op(__VA_ARGS__);                    \
  return cuda_kernel(cuda_entries().op, #op, device)(device, __VA_ARGS__)

void embedding_forward(Device device, float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                       bool accumulate) {
  LOOM_DISPATCH(embedding_forward, out, ids, table, rows, dim, accumulate);
}
void embedding_backward(Device device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                        int64_t dim) {
  LOOM_DISPATCH(embedding_backward, dtable, dout, ids, rows, dim);
}
void embedding_forward_shard(Device device, float* out, const int32_t* ids, const float* table, int64_t rows,
                             int64_t dim, int64_t first_id, int64_t count) {
  LOOM_DISPATCH(embedding_forward_shard, out, ids, table, rows, dim, first_id, count);
}
void embedding_backward_shard(Device device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                              int64_t dim, int64_t first_id, int64_t count) {
  LOOM_DISPATCH(embedding_backward_shard, dtable, dout, ids, rows, dim, first_id, count);
}

void rmsnorm_forward(Device device, float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t dim, float eps) {
  if (device.is_cpu()) [[likely]]
    return cpu::rmsnorm_forward(out, rstd, in, weight, rows, dim, eps);
  cuda_kernel(cuda_entries().rmsnorm_forward, "rmsnorm_forward", device)(device, out, rstd, in, weight, rows, dim,
                                                                          eps);
}
void rmsnorm_backward(Device device, float* din, float* dweight, const float* dout, const float* in,
                      const float* weight, const float* rstd, int64_t rows, int64_t dim, void* din16,
                      float* din_amax) {
  LOOM_DISPATCH(rmsnorm_backward, din, dweight, dout, in, weight, rstd, rows, dim, din16, din_amax);
}
void layernorm_forward(Device device, float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t dim, float eps) {
  LOOM_DISPATCH(layernorm_forward, out, mean, rstd, in, weight, bias, rows, dim, eps);
}
void layernorm_backward(Device device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16, float* din_amax) {
  LOOM_DISPATCH(layernorm_backward, din, dweight, dbias, dout, in, weight, mean, rstd, rows, dim, din16, din_amax);
}
void rmsnorm_forward_bf16(Device device, void* out16, float* rstd, const float* in, const float* weight,
                          int64_t rows, int64_t dim, float eps) {
  LOOM_DISPATCH(rmsnorm_forward_bf16, out16, rstd, in, weight, rows, dim, eps);
}
void layernorm_forward_bf16(Device device, void* out16, float* mean, float* rstd, const float* in,
                            const float* weight, const float* bias, int64_t rows, int64_t dim, float eps) {
  LOOM_DISPATCH(layernorm_forward_bf16, out16, mean, rstd, in, weight, bias, rows, dim, eps);
}
void rmsnorm_add_forward_bf16(Device device, void* out16, float* rstd, float* sum, const float* residual,
                              const void* add16, const float* weight, int64_t rows, int64_t dim, float eps) {
  LOOM_DISPATCH(rmsnorm_add_forward_bf16, out16, rstd, sum, residual, add16, weight, rows, dim, eps);
}
void layernorm_add_forward_bf16(Device device, void* out16, float* mean, float* rstd, float* sum,
                                const float* residual, const void* add16, const float* weight, const float* bias,
                                int64_t rows, int64_t dim, float eps) {
  LOOM_DISPATCH(layernorm_add_forward_bf16, out16, mean, rstd, sum, residual, add16, weight, bias, rows, dim, eps);
}
void rmsnorm_backward_bf16(Device device, float* din, float* dweight, const void* dout16, const float* in,
                           const float* weight, const float* rstd, int64_t rows, int64_t dim, void* din16,
                           float* din_amax) {
  LOOM_DISPATCH(rmsnorm_backward_bf16, din, dweight, dout16, in, weight, rstd, rows, dim, din16, din_amax);
}
void layernorm_backward_bf16(Device device, float* din, float* dweight, float* dbias, const void* dout16,
                             const float* in, const float* weight, const float* mean, const float* rstd, int64_t rows,
                             int64_t dim, void* din16, float* din_amax) {
  LOOM_DISPATCH(layernorm_backward_bf16, din, dweight, dbias, dout16, in, weight, mean, rstd, rows, dim, din16,
                din_amax);
}

void rope_forward(Device device, float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                  int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  LOOM_DISPATCH(rope_forward, x, rows, row_stride, first_col, heads, seq, positions_start, table, positions);
}
void rope_backward(Device device, float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                   int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  LOOM_DISPATCH(rope_backward, dx, rows, row_stride, first_col, heads, seq, positions_start, table, positions);
}
void rope_forward_bf16(Device device, void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                       int64_t seq, int64_t positions_start, const RopeTable& table, const int32_t* positions) {
  LOOM_DISPATCH(rope_forward_bf16, x16, rows, row_stride, first_col, heads, seq, positions_start, table, positions);
}

void swiglu_forward(Device device, float* out, const float* gate_up, int64_t rows, int64_t width) {
  if (device.is_cpu()) [[likely]]
    return cpu::swiglu_forward(out, gate_up, rows, width);
  cuda_kernel(cuda_entries().swiglu_forward, "swiglu_forward", device)(device, out, gate_up, rows, width);
}
void swiglu_backward(Device device, float* dgate_up, const float* dout, const float* gate_up, int64_t rows,
                     int64_t width) {
  if (device.is_cpu()) [[likely]]
    return cpu::swiglu_backward(dgate_up, dout, gate_up, rows, width);
  cuda_kernel(cuda_entries().swiglu_backward, "swiglu_backward", device)(device, dgate_up, dout, gate_up, rows, width);
}
void gelu_forward(Device device, float* out, const float* in, int64_t n) {
  if (device.is_cpu()) [[likely]]
    return cpu::gelu_forward(out, in, n);
  cuda_kernel(cuda_entries().gelu_forward, "gelu_forward", device)(device, out, in, n);
}
void gelu_backward(Device device, float* din, const float* dout, const float* in, int64_t n) {
  if (device.is_cpu()) [[likely]]
    return cpu::gelu_backward(din, dout, in, n);
  cuda_kernel(cuda_entries().gelu_backward, "gelu_backward", device)(device, din, dout, in, n);
}

void linear_forward(Device device, float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate) {
  LOOM_DISPATCH(linear_forward, out, in, weight, bias, n, in_features, out_features, accumulate);
}
void linear_backward(Device device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features, bool accumulate_din,
                     bool accumulate_dweight) {
  LOOM_DISPATCH(linear_backward, din, dweight, dbias, dout, in, weight, n, in_features, out_features, accumulate_din,
                accumulate_dweight);
}
void add_bias(Device device, float* x, const float* bias, int64_t rows, int64_t width) {
  LOOM_DISPATCH(add_bias, x, bias, rows, width);
}
void gemm_nt(Device device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
             bool accumulate) {
  LOOM_DISPATCH(gemm_nt, c, a, b, m, n, k, accumulate);
}
void gemm(Device device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
          bool trans_b, bool accumulate) {
  LOOM_DISPATCH(gemm, c, a, b, m, n, k, trans_a, trans_b, accumulate);
}

namespace {
void check_flash_shape(const FlashAttentionShape& s) {
  LOOM_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0,
             "flash attention: kv_heads " + std::to_string(s.kv_heads) + " must divide heads " +
                 std::to_string(s.heads));
}
// The RoPE a gradient-writing backward undoes: a table of the shape's head size (the rotation
// walks heads by it, so another size would leave columns unwritten), rows placed by positions or
// by a positive sequence length.
void check_rotation(const FlashAttentionShape& s, const QkvRotation& rotation, const char* entry) {
  if (rotation.table == nullptr) return;
  LOOM_CHECK(rotation.table->head_dim == s.head_dim,
             std::string(entry) + ": the RoPE table's head size " + std::to_string(rotation.table->head_dim) +
                 " is not the attention's " + std::to_string(s.head_dim));
  LOOM_CHECK(rotation.positions != nullptr || rotation.seq > 0,
             std::string(entry) + ": a rotation needs positions or a positive sequence length (got seq " +
                 std::to_string(rotation.seq) + ")");
}
// Both paged entries index the pools by it: checked before the cache write as before attention.
void check_paged_shape(const PagedAttentionShape& s, const char* entry) {
  LOOM_CHECK(s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 && s.head_dim > 0 && s.block_size > 0,
             std::string(entry) + ": heads " + std::to_string(s.heads) + ", kv_heads " + std::to_string(s.kv_heads) +
                 ", head_dim " + std::to_string(s.head_dim) + ", block_size " + std::to_string(s.block_size) +
                 " (positive, kv_heads dividing heads)");
}
}  // namespace

void flash_attention_forward(Device device, float* out, float* lse, const float* q, const float* k, const float* v,
                             const FlashAttentionShape& s, const AttentionVisibility& vis) {
  check_flash_shape(s);
  if (device.is_cpu()) [[likely]] {
    if (s.operands == AttentionOperands::Bf16) return cpu::flash_attention_forward_bf16(out, lse, q, k, v, s, vis);
    return cpu::flash_attention_forward(out, lse, q, k, v, s, vis);
  }
  cuda_kernel(cuda_entries().flash_attention_forward, "flash_attention_forward", device)(device, out, lse, q, k, v, s,
                                                                                          vis);
}
void flash_attention_backward(Device device, float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const FlashAttentionShape& s, const AttentionVisibility& vis) {
  check_flash_shape(s);
  if (device.is_cpu()) [[likely]] {
    if (s.operands == AttentionOperands::Bf16)
      return cpu::flash_attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, s, vis);
    return cpu::flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s, vis);
  }
  cuda_kernel(cuda_entries().flash_attention_backward, "flash_attention_backward", device)(
      device, dq, dk, dv, dout, out, lse, q, k, v, s, vis);
}
void flash_attention_forward_bf16_tensors(Device device, void* out16, float* lse, const void* q16, const void* k16,
                                          const void* v16, const FlashAttentionShape& s,
                                          const AttentionVisibility& vis) {
  check_flash_shape(s);
  LOOM_CHECK(s.operands == AttentionOperands::Bf16, "flash attention on bf16 tensors takes bf16 operands");
  LOOM_DISPATCH(flash_attention_forward_bf16_tensors, out16, lse, q16, k16, v16, s, vis);
}
void flash_attention_backward_bf16_tensors(Device device, float* dq, float* dk, float* dv, const void* dout16,
                                           const void* out16, const float* lse, const void* q16, const void* k16,
                                           const void* v16, const FlashAttentionShape& s,
                                           const AttentionVisibility& vis) {
  check_flash_shape(s);
  LOOM_CHECK(s.operands == AttentionOperands::Bf16, "flash attention on bf16 tensors takes bf16 operands");
  LOOM_DISPATCH(flash_attention_backward_bf16_tensors, dq, dk, dv, dout16, out16, lse, q16, k16, v16, s, vis);
}
void flash_attention_backward_bf16_gradients(Device device, void* dq16, void* dk16, void* dv16, float* dbias_q,
                                             float* dbias_k, float* dbias_v, const void* dout16, const void* out16,
                                             const float* lse, const void* q16, const void* k16, const void* v16,
                                             const FlashAttentionShape& s, const AttentionVisibility& vis,
                                             const QkvRotation& rotation) {
  check_flash_shape(s);
  LOOM_CHECK(s.operands == AttentionOperands::Bf16, "flash attention on bf16 tensors takes bf16 operands");
  LOOM_CHECK(rotation.table == nullptr || (dbias_q == nullptr && dbias_k == nullptr && dbias_v == nullptr),
             "flash_attention_backward_bf16_gradients: a rotated gradient's bias sums are not taken here (the "
             "projection keeps an fp32 q/k/v gradient for them)");
  check_rotation(s, rotation, "flash_attention_backward_bf16_gradients");
  LOOM_DISPATCH(flash_attention_backward_bf16_gradients, dq16, dk16, dv16, dbias_q, dbias_k, dbias_v, dout16, out16,
                lse, q16, k16, v16, s, vis, rotation);
}
void flash_attention_backward_fp32_gradients(Device device, float* dq, float* dk, float* dv, const void* dout16,
                                             const void* out16, const float* lse, const void* q16, const void* k16,
                                             const void* v16, const FlashAttentionShape& s,
                                             const AttentionVisibility& vis, const QkvRotation& rotation,
                                             float* amax) {
  check_flash_shape(s);
  LOOM_CHECK(s.operands == AttentionOperands::Bf16, "flash attention on bf16 tensors takes bf16 operands");
  check_rotation(s, rotation, "flash_attention_backward_fp32_gradients");
  LOOM_DISPATCH(flash_attention_backward_fp32_gradients, dq, dk, dv, dout16, out16, lse, q16, k16, v16, s, vis,
                rotation, amax);
}
void merge_attention_partials(Device device, float* out, float* lse, const float* part_out, const float* part_lse,
                              const FlashAttentionShape& s) {
  if (device.is_cpu()) [[likely]]
    return cpu::merge_attention_partials(out, lse, part_out, part_lse, s);
  cuda_kernel(cuda_entries().merge_attention_partials, "merge_attention_partials", device)(device, out, lse, part_out,
                                                                                            part_lse, s);
}
void reference_attention_forward(Device device, float* out, float* probs, const float* qkv, const AttentionShape& s) {
  LOOM_CPU_ONLY(reference_attention_forward, out, probs, qkv, s);
}
void reference_attention_backward(Device device, float* dqkv, const float* dout, const float* probs,
                                  const float* qkv, const AttentionShape& s) {
  LOOM_CPU_ONLY(reference_attention_backward, dqkv, dout, probs, qkv, s);
}
void attention_decode(Device device, float* out, const float* q, int64_t q_stride, const float* k_cache,
                      const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads,
                      int64_t head_dim) {
  LOOM_DISPATCH(attention_decode, out, q, q_stride, k_cache, v_cache, past, new_tokens, heads, kv_heads, head_dim);
}
void paged_attention(Device device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                     const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                     const int32_t* positions, int64_t rows, const PagedAttentionShape& shape) {
  check_paged_shape(shape, "paged_attention");
  LOOM_DISPATCH(paged_attention, out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, rows, shape);
}
bool paged_prompt_attention_on_tensor_cores(Device device, const PagedAttentionShape& shape, int64_t q_stride) {
  return !device.is_cpu() && cuda_entries().paged_prompt_attention != nullptr && shape.cache == KvCacheDtype::Bf16 &&
         (shape.head_dim == 64 || shape.head_dim == 128) && q_stride % 4 == 0;
}
void paged_prompt_attention(Device device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                            const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                            const int32_t* positions, const int32_t* tiles, int64_t tile_count, int64_t reach,
                            const PagedAttentionShape& shape) {
  check_paged_shape(shape, "paged_prompt_attention");
  LOOM_CHECK(device.is_cpu() || paged_prompt_attention_on_tensor_cores(device, shape, q_stride),
             "paged_prompt_attention on " + device.name() + ": served on tensor cores for a bf16 cache, head_dim 64 "
             "or 128 and a q stride that is a multiple of 4 (head_dim " + std::to_string(shape.head_dim) + ", cache " +
             (shape.cache == KvCacheDtype::Bf16 ? "bf16" : "fp32") + ", q stride " + std::to_string(q_stride) + ")");
  LOOM_DISPATCH(paged_prompt_attention, out, q, q_stride, k_pool, v_pool, block_tables, sequences, positions, tiles,
                tile_count, reach, shape);
}
void paged_cache_write(Device device, void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                       const int32_t* block_tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                       const PagedAttentionShape& shape) {
  check_paged_shape(shape, "paged_cache_write");
  LOOM_DISPATCH(paged_cache_write, k_pool, v_pool, k, v, stride, block_tables, sequences, positions, rows, shape);
}

double softmax_cross_entropy(Device device, float* logits, float* losses, const int32_t* targets, int64_t rows,
                             int64_t vocab, float grad_scale) {
  LOOM_DISPATCH(softmax_cross_entropy, logits, losses, targets, rows, vocab, grad_scale);
}
double softmax_cross_entropy_bf16(Device device, void* logits, float* losses, const int32_t* targets, int64_t rows,
                                  int64_t vocab, float grad_scale) {
  LOOM_DISPATCH(softmax_cross_entropy_bf16, logits, losses, targets, rows, vocab, grad_scale);
}
void vocab_shard_row_max(Device device, const float* logits, int64_t rows, int64_t vocab_shard, float* row_max) {
  LOOM_DISPATCH(vocab_shard_row_max, logits, rows, vocab_shard, row_max);
}
void vocab_shard_exp_sums(Device device, const float* logits, const float* row_max, const int32_t* targets,
                          int64_t rows, int64_t vocab_shard, int64_t first_id, float* stats) {
  LOOM_DISPATCH(vocab_shard_exp_sums, logits, row_max, targets, rows, vocab_shard, first_id, stats);
}
double vocab_shard_finish(Device device, float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale) {
  LOOM_DISPATCH(vocab_shard_finish, logits, losses, row_max, stats, targets, rows, vocab_shard, first_id,
                grad_scale);
}
void vocab_shard_gradient(Device device, float* logits, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          const float* row_scale) {
  LOOM_DISPATCH(vocab_shard_gradient, logits, row_max, stats, targets, rows, vocab_shard, first_id, row_scale);
}

void adamw_update(Device device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWStep& step) {
  if (device.is_cpu()) [[likely]]
    return cpu::adamw_update(param, grad, exp_avg, exp_avg_sq, n, step);
  cuda_kernel(cuda_entries().adamw_update, "adamw_update", device)(device, param, grad, exp_avg, exp_avg_sq, n, step);
}
void adamw_update_many(Device device, std::span<const AdamWTensor> tensors, std::span<const AdamWStep> steps) {
  LOOM_CHECK(!steps.empty() && steps.size() <= static_cast<size_t>(kMaxAdamWSteps),
             "adamw_update_many: 1 to " + std::to_string(kMaxAdamWSteps) + " steps, not " +
                 std::to_string(steps.size()));
  // Every tensor checked before any is updated, here for every device.
  for (const AdamWTensor& t : tensors) {
    LOOM_CHECK(t.step_index >= 0 && static_cast<size_t>(t.step_index) < steps.size(),
               "adamw_update_many: a tensor's step_index " + std::to_string(t.step_index) + " outside the " +
                   std::to_string(steps.size()) + " steps given");
    LOOM_CHECK(t.fp8.forward == nullptr || !device.is_cpu(),
               "adamw_update_many: an FP8 weight's codes go to its stores in device memory (a CPU run has none)");
    LOOM_CHECK(t.fp8.forward == nullptr ||
                   (t.fp8.amax != nullptr && t.fp8.transposed != nullptr && t.fp8.rows * t.fp8.cols == t.n),
               "adamw_update_many: an FP8 weight's codes need its shape (rows x cols = n), both stores and its amax");
  }
  if (device.is_cpu()) [[likely]] {
    for (const AdamWTensor& t : tensors) {
      cpu::adamw_update(t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.n, steps[static_cast<size_t>(t.step_index)]);
      if (t.param_bf16 != nullptr) narrow_floats(device, t.param_bf16, t.param, t.n, DType::BF16);
      if (t.fp8.amax != nullptr) cpu::amax_into(t.fp8.amax, t.param, t.n);
    }
    return;
  }
  cuda_kernel(cuda_entries().adamw_update_many, "adamw_update_many", device)(
      device, tensors.data(), static_cast<int64_t>(tensors.size()), steps.data(), static_cast<int64_t>(steps.size()));
}
void zero_runs(Device device, float* base, std::span<const FloatRun> runs) {
  for (const FloatRun& r : runs) {
    LOOM_CHECK(r.begin >= 0 && r.n >= 0, "zero_runs: a run at " + std::to_string(r.begin) + " of " +
                                             std::to_string(r.n) + " elements (both must be >= 0)");
  }
  if (runs.empty()) return;
  if (device.is_cpu()) [[likely]] {
    for (const FloatRun& r : runs) std::fill_n(base + r.begin, r.n, 0.0f);
    return;
  }
  cuda_kernel(cuda_entries().zero_runs, "zero_runs", device)(device, base, runs.data(),
                                                             static_cast<int64_t>(runs.size()));
}
void device_profiler_capture(Device device, bool start) {
  if (device.is_cpu()) return;
  cuda_kernel(cuda_entries().profiler_capture, "device_profiler_capture", device)(device, start);
}
double sum_of_squares(Device device, const float* x, int64_t n) { LOOM_DISPATCH(sum_of_squares, x, n); }
void scale_in_place(Device device, float* x, int64_t n, float factor) {
  LOOM_DISPATCH(scale_in_place, x, n, factor);
}
void add_in_place(Device device, float* y, const float* x, int64_t n) { LOOM_DISPATCH(add_in_place, y, x, n); }
void nesterov_outer_update(Device device, float* anchor, float* momentum, const float* delta, int64_t n, float lr,
                           float mu) {
  LOOM_DISPATCH(nesterov_outer_update, anchor, momentum, delta, n, lr, mu);
}

void amax_into(Device device, float* dst, const float* x, int64_t n) { LOOM_DISPATCH(amax_into, dst, x, n); }
void amax_into_bf16(Device device, float* dst, const void* x16, int64_t n) {
  LOOM_DISPATCH(amax_into_bf16, dst, x16, n);
}
void narrow_floats(Device device, void* dst, const float* src, int64_t n, DType dtype) {
  LOOM_DISPATCH(narrow_floats, dst, src, n, dtype);
}
void widen_floats(Device device, float* dst, const void* src, int64_t n, DType dtype, bool accumulate) {
  LOOM_DISPATCH(widen_floats, dst, src, n, dtype, accumulate);
}

// The recipes' device entries have no CPU kernel: the CPU path emulates them in the model layer.
#define LOOM_DEVICE_ONLY(op, ...)                                                                      \
  if (device.is_cpu()) [[unlikely]]                                                                  \
    throw Error("kernels::" #op " runs on a GPU only; on the CPU the precision recipes are emulated " \
                "(model/linear_precision.cpp)");                                                      \
  return cuda_kernel(cuda_entries().op, #op, device)(device, __VA_ARGS__)

float amax(Device device, const float* x, int64_t n) { LOOM_DEVICE_ONLY(amax, x, n); }
void round_in_place(Device device, float* x, int64_t n, OutputRounding rounding) {
  LOOM_DEVICE_ONLY(round_in_place, x, n, rounding);
}
void precision_linear_gemm(Device device, const PrecisionGemm& gemm) {
  LOOM_DEVICE_ONLY(precision_linear_gemm, gemm);
}
void precision_linear_gemms(Device device, const PrecisionGemm* gemms, int64_t count) {
  if (count == 0) return;
  LOOM_DEVICE_ONLY(precision_linear_gemms, gemms, count);
}
void activation_forward_codes(Device device, MlpActivation activation, const void* in16, int64_t rows, int64_t width,
                              const CastOperand& cast, void* codes, void* transposed) {
  LOOM_DEVICE_ONLY(activation_forward_codes, activation, in16, rows, width, cast, codes, transposed);
}
void activation_backward_codes(Device device, MlpActivation activation, const void* dout16, const void* in16,
                               int64_t rows, int64_t width, const CastOperand& cast, void* codes, void* transposed) {
  LOOM_DEVICE_ONLY(activation_backward_codes, activation, dout16, in16, rows, width, cast, codes, transposed);
}
void norm_statistics(Device device, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                     int64_t rows, int64_t dim, float eps, float* amax) {
  LOOM_DEVICE_ONLY(norm_statistics, mean, rstd, in, weight, bias, rows, dim, eps, amax);
}
void norm_forward_codes(Device device, const float* in, const float* weight, const float* bias, const float* mean,
                        const float* rstd, int64_t rows, int64_t dim, const CastOperand& cast, void* codes,
                        void* transposed) {
  LOOM_DEVICE_ONLY(norm_forward_codes, in, weight, bias, mean, rstd, rows, dim, cast, codes, transposed);
}
#undef LOOM_DEVICE_ONLY

void relu2_forward(Device device, float* out, const float* in, int64_t n) { LOOM_DISPATCH(relu2_forward, out, in, n); }
void activation_forward_bf16(Device device, MlpActivation activation, float* out, void* out16, const void* in16,
                             int64_t rows, int64_t width, float* amax) {
  LOOM_DISPATCH(activation_forward_bf16, activation, out, out16, in16, rows, width, amax);
}
void activation_backward_bf16(Device device, MlpActivation activation, float* din, void* din16, float* dbias,
                              const void* dout16, const void* in16, int64_t rows, int64_t width, float* amax) {
  LOOM_DISPATCH(activation_backward_bf16, activation, din, din16, dbias, dout16, in16, rows, width, amax);
}
void relu2_backward(Device device, float* din, const float* dout, const float* in, int64_t n) {
  LOOM_DISPATCH(relu2_backward, din, dout, in, n);
}
void add_rows(Device device, float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width) {
  LOOM_DISPATCH(add_rows, y, y_stride, x, x_stride, rows, width);
}
void gather_rows(Device device, float* out, const float* x, const int32_t* index, const float* scale, int64_t rows,
                 int64_t width) {
  LOOM_DISPATCH(gather_rows, out, x, index, scale, rows, width);
}
void scatter_add_rows(Device device, float* out, const float* x, int64_t x_stride, const int32_t* index,
                      const float* scale, int64_t rows, int64_t width) {
  LOOM_DISPATCH(scatter_add_rows, out, x, x_stride, index, scale, rows, width);
}
void row_dots(Device device, double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride,
              int64_t rows, int64_t width) {
  LOOM_DISPATCH(row_dots, out, a, index, b, b_stride, rows, width);
}
void sigmoid_gate(Device device, float* gate, const double* logits, int64_t n) {
  if (n == 0) return;
  LOOM_DISPATCH(sigmoid_gate, gate, logits, n);
}
void sigmoid_gate_backward(Device device, float* d_logit, const double* dots, const float* gate, int64_t n) {
  if (n == 0) return;
  LOOM_DISPATCH(sigmoid_gate_backward, d_logit, dots, gate, n);
}
void moe_router_forward(Device device, const RouterForward& r) {
  LOOM_CHECK(r.experts > 0 && r.top_k > 0 && r.top_k <= r.experts && r.tokens >= 0,
             "moe_router_forward: " + std::to_string(r.top_k) + " of " + std::to_string(r.experts) +
                 " experts over " + std::to_string(r.tokens) + " tokens");
  LOOM_CHECK(r.prob_sums == nullptr || (r.group_tokens > 0 && r.tokens % r.group_tokens == 0),
             "moe_router_forward: the balancing loss's groups must split the tokens evenly");
  if (r.tokens == 0) return;
  LOOM_DISPATCH(moe_router_forward, r);
}
void moe_router_backward(Device device, float* d_logits, const RouterBackward& r) {
  LOOM_CHECK(r.experts > 0 && r.top_k > 0 && r.top_k <= r.experts && r.tokens >= 0,
             "moe_router_backward: " + std::to_string(r.top_k) + " of " + std::to_string(r.experts) +
                 " experts over " + std::to_string(r.tokens) + " tokens");
  LOOM_CHECK(r.aux_f == nullptr || (r.group_tokens > 0 && r.aux_factor != nullptr),
             "moe_router_backward: the balancing loss needs its groups' tokens and factors");
  if (r.tokens == 0) return;
  LOOM_DISPATCH(moe_router_backward, d_logits, r);
}

void ssd_scan_forward(Device device, float* y, const float* x, const float* dt_raw, const float* dt_bias,
                      const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                      const int32_t* documents) {
  LOOM_DISPATCH(ssd_scan_forward, y, x, dt_raw, dt_bias, A_log, B, C, D, s, documents);
}
void ssd_scan_backward(Device device, float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB,
                       float* dC, float* dD, const float* dy, const float* x, const float* dt_raw,
                       const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                       const SsdShape& s, const int32_t* documents) {
  LOOM_DISPATCH(ssd_scan_backward, dx, ddt_raw, ddt_bias, dA_log, dB, dC, dD, dy, x, dt_raw, dt_bias, A_log, B, C,
                D, s, documents);
}
namespace {
// A pool's slots name one token's state each: a chunk of several tokens continues one sequence.
void check_step_slots(const int32_t* slots, int64_t seq, const char* op) {
  LOOM_CHECK(slots == nullptr || seq == 1, std::string(op) + ": state slots with " + std::to_string(seq) +
                                               " tokens per row (slots take one token per row)");
}
}  // namespace
void ssd_scan_step(Device device, float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                   const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                   const SsdShape& s) {
  check_step_slots(slots, s.seq, "ssd_scan_step");
  LOOM_DISPATCH(ssd_scan_step, y, state, slots, x, dt_raw, dt_bias, A_log, B, C, D, s);
}
void causal_conv_silu_forward(Device device, float* out, const float* in, const float* weight, const float* bias,
                              const ConvShape& s, const int32_t* documents) {
  LOOM_DISPATCH(causal_conv_silu_forward, out, in, weight, bias, s, documents);
}
void causal_conv_silu_backward(Device device, float* din, float* dweight, float* dbias, const float* dout,
                               const float* in, const float* weight, const float* bias, const ConvShape& s,
                               const int32_t* documents) {
  LOOM_DISPATCH(causal_conv_silu_backward, din, dweight, dbias, dout, in, weight, bias, s, documents);
}
void causal_conv_silu_step(Device device, float* out, float* window, const int32_t* slots, const float* in,
                           const float* weight, const float* bias, const ConvShape& s) {
  check_step_slots(slots, s.seq, "causal_conv_silu_step");
  LOOM_DISPATCH(causal_conv_silu_step, out, window, slots, in, weight, bias, s);
}
namespace {
// The gated norm's groups tile each row: dim a positive multiple of group_size.
void check_norm_groups(int64_t dim, int64_t group_size) {
  LOOM_CHECK(group_size > 0 && dim % group_size == 0,
             "gated_rmsnorm: dim " + std::to_string(dim) + " is not a positive multiple of group_size " +
                 std::to_string(group_size));
}
}  // namespace
void gated_rmsnorm_forward(Device device, float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                           const float* weight, int64_t rows, int64_t dim, int64_t group_size, float eps) {
  check_norm_groups(dim, group_size);
  LOOM_DISPATCH(gated_rmsnorm_forward, out, rstd, y, z, z_stride, weight, rows, dim, group_size, eps);
}
void gated_rmsnorm_backward(Device device, float* dy, float* dz, float* dweight, const float* dout, const float* y,
                            const float* z, int64_t z_stride, const float* weight, const float* rstd, int64_t rows,
                            int64_t dim, int64_t group_size) {
  check_norm_groups(dim, group_size);
  LOOM_DISPATCH(gated_rmsnorm_backward, dy, dz, dweight, dout, y, z, z_stride, weight, rstd, rows, dim, group_size);
}

#undef LOOM_CPU_ONLY
#undef LOOM_DISPATCH

}  // namespace loom::kernels
