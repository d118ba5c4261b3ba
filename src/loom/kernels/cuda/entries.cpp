#include "loom/kernels/cuda/entries.h"

#include <cuda_profiler_api.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/kernels/cuda/activation.h"
#include "loom/kernels/cuda/activation_codes.h"
#include "loom/kernels/cuda/adamw.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/causal_conv.h"
#include "loom/kernels/cuda/cross_entropy.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/embedding.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/gated_norm.h"
#include "loom/kernels/cuda/gemm_lt.h"
#include "loom/kernels/cuda/grouped_gemm.h"
#include "loom/kernels/cuda/half_copies.h"
#include "loom/kernels/cuda/layernorm.h"
#include "loom/kernels/cuda/norm_codes.h"
#include "loom/kernels/cuda/paged_attention.h"
#include "loom/kernels/cuda/paged_prompt_attention.h"
#include "loom/kernels/cuda/precision_gemm.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/cuda/reduce.h"
#include "loom/kernels/cuda/rmsnorm.h"
#include "loom/kernels/cuda/rope.h"
#include "loom/kernels/cuda/moe_router.h"
#include "loom/kernels/cuda/rows.h"
#include "loom/kernels/cuda/ssd_scan.h"
#include "loom/kernels/cuda/zero_runs.h"

namespace loom::kernels::cuda {

namespace {

// Every entry runs on its tensors' device, made current first: the thread may have made another
// one current since (a rank's thread copying another GPU's buffer through that GPU's allocator,
// which selects it, in a process driving several GPUs). Asking is cheap; switching is rare.
cudaStream_t stream_of(Device d) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != d.index) check_cuda(cudaSetDevice(d.index), "cudaSetDevice(" + std::to_string(d.index) + ")");
  return compute_stream(d.index);
}

// RoPE tables live on the host (kernels/types.h); each device keeps a mirror per table address,
// uploaded again when a different table (another id) has come to live there. The old mirror is
// freed once no compute stream can still read it; the new one is on the device before any
// stream's kernel is handed it.
class RopeMirrors {
 public:
  DeviceRopeTable get(Device d, const RopeTable& t) {
    const cudaStream_t stream = stream_of(d);  // the mirror is made on d, whichever GPU was current
    std::lock_guard<std::mutex> lock(mutex_);
    Mirror& m = mirrors_[{d.index, &t}];
    if (m.device == nullptr || m.id != t.id) {
      if (m.device != nullptr) {
        synchronize_compute_streams(d.index);
        check_cuda(cudaFree(m.device), "cudaFree (RoPE table)");
      }
      m.device = nullptr;
      const size_t bytes = (t.cos.size() + t.sin.size()) * sizeof(float);
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&m.device), bytes), "cudaMalloc (RoPE table)");
      check_cuda(cudaMemcpyAsync(m.device, t.cos.data(), t.cos.size() * sizeof(float), cudaMemcpyHostToDevice,
                                 stream),
                 "cudaMemcpyAsync (RoPE cos)");
      check_cuda(cudaMemcpyAsync(m.device + t.cos.size(), t.sin.data(), t.sin.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync (RoPE sin)");
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (RoPE table upload)");
      m.id = t.id;
    }
    return DeviceRopeTable{m.device, m.device + t.cos.size(), t.head_dim};
  }

 private:
  struct Mirror {
    uint64_t id = 0;
    float* device = nullptr;
  };
  std::mutex mutex_;
  std::map<std::pair<int, const RopeTable*>, Mirror> mirrors_;
};

RopeMirrors& rope_mirrors() {
  static RopeMirrors mirrors;
  return mirrors;
}

// An attention backward's QkvRotation with its table mirrored on device d (held here).
class MirroredRotation {
 public:
  MirroredRotation(Device d, const QkvRotation& r) : rotation_{nullptr, r.seq, r.positions} {
    if (r.table == nullptr) return;
    table_ = rope_mirrors().get(d, *r.table);
    rotation_.table = &table_;
  }
  MirroredRotation(const MirroredRotation&) = delete;
  MirroredRotation& operator=(const MirroredRotation&) = delete;
  const DeviceQkvRotation& get() const { return rotation_; }

 private:
  DeviceRopeTable table_{};
  DeviceQkvRotation rotation_;
};

void register_norms_and_activations(CudaEntries& e) {
  e.rmsnorm_forward = [](Device d, float* out, float* rstd, const float* in, const float* w, int64_t rows,
                         int64_t dim, float eps) { rmsnorm_forward(out, rstd, in, w, rows, dim, eps, stream_of(d)); };
  e.rmsnorm_backward = [](Device d, float* din, float* dw, const float* dout, const float* in, const float* w,
                          const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax) {
    rmsnorm_backward(din, dw, dout, in, w, rstd, rows, dim, din16, din_amax, stream_of(d));
  };
  e.layernorm_forward = [](Device d, float* out, float* mean, float* rstd, const float* in, const float* w,
                           const float* b, int64_t rows, int64_t dim, float eps) {
    layernorm_forward(out, mean, rstd, in, w, b, rows, dim, eps, stream_of(d));
  };
  e.rmsnorm_forward_bf16 = [](Device d, void* out16, float* rstd, const float* in, const float* w, int64_t rows,
                              int64_t dim, float eps) {
    rmsnorm_forward_bf16(out16, rstd, in, w, rows, dim, eps, stream_of(d));
  };
  e.layernorm_forward_bf16 = [](Device d, void* out16, float* mean, float* rstd, const float* in, const float* w,
                                const float* b, int64_t rows, int64_t dim, float eps) {
    layernorm_forward_bf16(out16, mean, rstd, in, w, b, rows, dim, eps, stream_of(d));
  };
  e.rmsnorm_add_forward_bf16 = [](Device d, void* out16, float* rstd, float* sum, const float* residual,
                                  const void* add16, const float* w, int64_t rows, int64_t dim, float eps) {
    rmsnorm_add_forward_bf16(out16, rstd, sum, residual, add16, w, rows, dim, eps, stream_of(d));
  };
  e.layernorm_add_forward_bf16 = [](Device d, void* out16, float* mean, float* rstd, float* sum,
                                    const float* residual, const void* add16, const float* w, const float* b,
                                    int64_t rows, int64_t dim, float eps) {
    layernorm_add_forward_bf16(out16, mean, rstd, sum, residual, add16, w, b, rows, dim, eps, stream_of(d));
  };
  e.layernorm_backward = [](Device d, float* din, float* dw, float* db, const float* dout, const float* in,
                            const float* w, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                            void* din16, float* din_amax) {
    layernorm_backward(din, dw, db, dout, in, w, mean, rstd, rows, dim, din16, din_amax, stream_of(d));
  };
  e.rmsnorm_backward_bf16 = [](Device d, float* din, float* dw, const void* dout16, const float* in, const float* w,
                               const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax) {
    rmsnorm_backward_bf16(din, dw, dout16, in, w, rstd, rows, dim, din16, din_amax, stream_of(d));
  };
  e.layernorm_backward_bf16 = [](Device d, float* din, float* dw, float* db, const void* dout16, const float* in,
                                 const float* w, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                                 void* din16, float* din_amax) {
    layernorm_backward_bf16(din, dw, db, dout16, in, w, mean, rstd, rows, dim, din16, din_amax, stream_of(d));
  };
  e.swiglu_forward = [](Device d, float* out, const float* gu, int64_t rows, int64_t width) {
    swiglu_forward(out, gu, rows, width, stream_of(d));
  };
  e.swiglu_backward = [](Device d, float* dgu, const float* dout, const float* gu, int64_t rows, int64_t width) {
    swiglu_backward(dgu, dout, gu, rows, width, stream_of(d));
  };
  e.gelu_forward = [](Device d, float* out, const float* in, int64_t n) { gelu_forward(out, in, n, stream_of(d)); };
  e.gelu_backward = [](Device d, float* din, const float* dout, const float* in, int64_t n) {
    gelu_backward(din, dout, in, n, stream_of(d));
  };
  e.relu2_forward = [](Device d, float* out, const float* in, int64_t n) { relu2_forward(out, in, n, stream_of(d)); };
  e.relu2_backward = [](Device d, float* din, const float* dout, const float* in, int64_t n) {
    relu2_backward(din, dout, in, n, stream_of(d));
  };
  e.activation_forward_bf16 = [](Device d, MlpActivation a, float* out, void* out16, const void* in, int64_t rows,
                                 int64_t width, float* amax) {
    activation_forward_bf16(a, out, out16, in, rows, width, amax, stream_of(d));
  };
  e.activation_backward_bf16 = [](Device d, MlpActivation a, float* din, void* din16, float* dbias, const void* dout,
                                  const void* in, int64_t rows, int64_t width, float* amax) {
    activation_backward_bf16(a, din, din16, dbias, dout, in, rows, width, amax, stream_of(d));
  };
}

// The row moves of a mixture-of-experts layer (and context parallelism's column blocks), its
// router and its shared expert's gate.
void register_rows_and_routing(CudaEntries& e) {
  e.add_rows = [](Device d, float* y, int64_t ys, const float* x, int64_t xs, int64_t rows, int64_t width) {
    add_rows(y, ys, x, xs, rows, width, stream_of(d));
  };
  e.gather_rows = [](Device d, float* out, const float* x, const int32_t* index, const float* scale, int64_t rows,
                     int64_t width) { gather_rows(out, x, index, scale, rows, width, stream_of(d)); };
  e.scatter_add_rows = [](Device d, float* out, const float* x, int64_t xs, const int32_t* index, const float* scale,
                          int64_t rows, int64_t width) {
    scatter_add_rows(out, x, xs, index, scale, rows, width, stream_of(d));
  };
  e.row_dots = [](Device d, double* out, const float* a, const int32_t* index, const float* b, int64_t bs,
                  int64_t rows, int64_t width) { row_dots(out, a, index, b, bs, rows, width, stream_of(d)); };
  e.sigmoid_gate = [](Device d, float* gate, const double* logits, int64_t n) {
    sigmoid_gate(gate, logits, n, stream_of(d));
  };
  e.sigmoid_gate_backward = [](Device d, float* d_logit, const double* dots, const float* gate, int64_t n) {
    sigmoid_gate_backward(d_logit, dots, gate, n, stream_of(d));
  };
  e.moe_router_forward = [](Device d, const RouterForward& r) { moe_router_forward(r, stream_of(d)); };
  e.moe_router_backward = [](Device d, float* d_logits, const RouterBackward& r) {
    moe_router_backward(d_logits, r, stream_of(d));
  };
}

void register_embedding_and_rope(CudaEntries& e) {
  e.embedding_forward = [](Device d, float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                           bool accumulate) { embedding_forward(out, ids, table, rows, dim, accumulate, stream_of(d)); };
  e.embedding_backward = [](Device d, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                            int64_t dim) { embedding_backward(dtable, dout, ids, rows, dim, stream_of(d)); };
  e.embedding_forward_shard = [](Device d, float* out, const int32_t* ids, const float* table, int64_t rows,
                                 int64_t dim, int64_t first, int64_t count) {
    embedding_forward_shard(out, ids, table, rows, dim, first, count, stream_of(d));
  };
  e.embedding_backward_shard = [](Device d, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                                  int64_t dim, int64_t first, int64_t count) {
    embedding_backward_shard(dtable, dout, ids, rows, dim, first, count, stream_of(d));
  };
  e.rope_forward = [](Device d, float* x, int64_t rows, int64_t stride, int64_t col, int64_t heads, int64_t seq,
                      int64_t start, const RopeTable& t, const int32_t* positions) {
    rope_forward(x, rows, stride, col, heads, seq, start, rope_mirrors().get(d, t), positions, stream_of(d));
  };
  e.rope_backward = [](Device d, float* dx, int64_t rows, int64_t stride, int64_t col, int64_t heads, int64_t seq,
                       int64_t start, const RopeTable& t, const int32_t* positions) {
    rope_backward(dx, rows, stride, col, heads, seq, start, rope_mirrors().get(d, t), positions, stream_of(d));
  };
  e.rope_forward_bf16 = [](Device d, void* x16, int64_t rows, int64_t stride, int64_t col, int64_t heads, int64_t seq,
                           int64_t start, const RopeTable& t, const int32_t* positions) {
    rope_forward_bf16(x16, rows, stride, col, heads, seq, start, rope_mirrors().get(d, t), positions, stream_of(d));
  };
}

void register_products(CudaEntries& e) {
  e.linear_forward = [](Device d, float* out, const float* in, const float* w, const float* b, int64_t n,
                        int64_t in_f, int64_t out_f, bool accumulate) {
    linear_forward(out, in, w, b, n, in_f, out_f, accumulate, stream_of(d));
  };
  e.linear_backward = [](Device d, float* din, float* dw, float* db, const float* dout, const float* in,
                         const float* w, int64_t n, int64_t in_f, int64_t out_f, bool accumulate_din,
                         bool accumulate_dweight) {
    linear_backward(din, dw, db, dout, in, w, n, in_f, out_f, accumulate_din, accumulate_dweight, stream_of(d));
  };
  e.add_bias = [](Device d, float* x, const float* bias, int64_t rows, int64_t width) {
    broadcast_bias(x, bias, rows, width, true, stream_of(d));
  };
  e.gemm_nt = [](Device d, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                 bool accumulate) { gemm(c, a, b, m, n, k, false, true, accumulate, stream_of(d)); };
  e.gemm = [](Device d, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
              bool accumulate) { gemm(c, a, b, m, n, k, ta, tb, accumulate, stream_of(d)); };
}

void register_attention(CudaEntries& e) {
  e.flash_attention_forward = [](Device d, float* out, float* lse, const float* q, const float* k, const float* v,
                                 const FlashAttentionShape& s, const AttentionVisibility& vis) {
    if (s.operands == AttentionOperands::Bf16)
      return flash_attention_forward_bf16(out, lse, q, k, v, s, vis, stream_of(d));
    flash_attention_forward(out, lse, q, k, v, s, vis, stream_of(d));
  };
  e.flash_attention_backward = [](Device d, float* dq, float* dk, float* dv, const float* dout, const float* out,
                                  const float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis) {
    if (s.operands == AttentionOperands::Bf16)
      return flash_attention_backward_bf16(dq, dk, dv, dout, out, lse, q, k, v, s, vis, stream_of(d));
    flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s, vis, stream_of(d));
  };
  e.flash_attention_forward_bf16_tensors = [](Device d, void* out16, float* lse, const void* q16, const void* k16,
                                              const void* v16, const FlashAttentionShape& s,
                                              const AttentionVisibility& vis) {
    flash_attention_forward_bf16_tensors(out16, lse, q16, k16, v16, s, vis, stream_of(d));
  };
  e.flash_attention_backward_bf16_tensors = [](Device d, float* dq, float* dk, float* dv, const void* dout16,
                                               const void* out16, const float* lse, const void* q16,
                                               const void* k16, const void* v16, const FlashAttentionShape& s,
                                               const AttentionVisibility& vis) {
    flash_attention_backward_bf16_tensors(dq, dk, dv, dout16, out16, lse, q16, k16, v16, s, vis, stream_of(d));
  };
  e.flash_attention_backward_bf16_gradients = [](Device d, void* dq16, void* dk16, void* dv16, float* dbias_q,
                                                 float* dbias_k, float* dbias_v, const void* dout16,
                                                 const void* out16, const float* lse, const void* q16,
                                                 const void* k16, const void* v16, const FlashAttentionShape& s,
                                                 const AttentionVisibility& vis, const QkvRotation& rotation) {
    const MirroredRotation rotate(d, rotation);
    flash_attention_backward_bf16_gradients(dq16, dk16, dv16, dbias_q, dbias_k, dbias_v, dout16, out16, lse, q16, k16,
                                            v16, s, vis, rotate.get(), stream_of(d));
  };
  e.flash_attention_backward_fp32_gradients = [](Device d, float* dq, float* dk, float* dv, const void* dout16,
                                                 const void* out16, const float* lse, const void* q16,
                                                 const void* k16, const void* v16, const FlashAttentionShape& s,
                                                 const AttentionVisibility& vis, const QkvRotation& rotation,
                                                 float* amax) {
    const MirroredRotation rotate(d, rotation);
    flash_attention_backward_fp32_gradients(dq, dk, dv, dout16, out16, lse, q16, k16, v16, s, vis, rotate.get(), amax,
                                            stream_of(d));
  };
  e.merge_attention_partials = [](Device d, float* out, float* lse, const float* part_out, const float* part_lse,
                                  const FlashAttentionShape& s) {
    merge_attention_partials(out, lse, part_out, part_lse, s, stream_of(d));
  };
  e.paged_attention = [](Device d, float* out, const float* q, int64_t q_stride, const void* k_pool,
                         const void* v_pool, const int32_t* tables, const int32_t* sequences, const int32_t* positions,
                         int64_t rows, const PagedAttentionShape& s) {
    paged_attention(out, q, q_stride, k_pool, v_pool, tables, sequences, positions, rows, s, stream_of(d));
  };
  e.paged_prompt_attention = [](Device d, float* out, const float* q, int64_t q_stride, const void* k_pool,
                                const void* v_pool, const int32_t* tables, const int32_t* sequences,
                                const int32_t* positions, const int32_t* tiles, int64_t tile_count, int64_t reach,
                                const PagedAttentionShape& s) {
    paged_prompt_attention(out, q, q_stride, k_pool, v_pool, tables, sequences, positions, tiles, tile_count, reach,
                           s, stream_of(d));
  };
  e.attention_decode = [](Device d, float* out, const float* q, int64_t q_stride, const float* k_cache,
                          const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads,
                          int64_t head_dim) {
    attention_decode(out, q, q_stride, k_cache, v_cache, past, new_tokens, heads, kv_heads, head_dim, stream_of(d));
  };
  e.paged_cache_write = [](Device d, void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                           const int32_t* tables, const int32_t* sequences, const int32_t* positions, int64_t rows,
                           const PagedAttentionShape& s) {
    paged_cache_write(k_pool, v_pool, k, v, stride, tables, sequences, positions, rows, s, stream_of(d));
  };
}

void register_loss_and_optimizer(CudaEntries& e) {
  e.softmax_cross_entropy = [](Device d, float* logits, float* losses, const int32_t* targets, int64_t rows,
                               int64_t vocab, float grad_scale) {
    return softmax_cross_entropy(logits, losses, targets, rows, vocab, grad_scale, stream_of(d));
  };
  e.softmax_cross_entropy_bf16 = [](Device d, void* logits, float* losses, const int32_t* targets, int64_t rows,
                                    int64_t vocab, float grad_scale) {
    return softmax_cross_entropy_bf16(logits, losses, targets, rows, vocab, grad_scale, stream_of(d));
  };
  e.vocab_shard_row_max = [](Device d, const float* logits, int64_t rows, int64_t vocab, float* row_max) {
    vocab_shard_row_max(logits, rows, vocab, row_max, stream_of(d));
  };
  e.vocab_shard_exp_sums = [](Device d, const float* logits, const float* row_max, const int32_t* targets,
                              int64_t rows, int64_t vocab, int64_t first, float* stats) {
    vocab_shard_exp_sums(logits, row_max, targets, rows, vocab, first, stats, stream_of(d));
  };
  e.vocab_shard_gradient = [](Device d, float* logits, const float* row_max, const float* stats,
                                const int32_t* targets, int64_t rows, int64_t vocab, int64_t first,
                                const float* row_scale) {
    vocab_shard_gradient(logits, row_max, stats, targets, rows, vocab, first, row_scale, stream_of(d));
  };
  e.vocab_shard_finish = [](Device d, float* logits, float* losses, const float* row_max, const float* stats,
                            const int32_t* targets, int64_t rows, int64_t vocab, int64_t first, float grad_scale) {
    return vocab_shard_finish(logits, losses, row_max, stats, targets, rows, vocab, first, grad_scale, stream_of(d));
  };
  e.adamw_update = [](Device d, float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& step) {
    adamw_update(p, g, m, v, n, step, stream_of(d));
  };
  e.adamw_update_many = [](Device d, const AdamWTensor* tensors, int64_t count, const AdamWStep* steps,
                           int64_t step_count) {
    adamw_update_many(tensors, count, steps, step_count, stream_of(d));
  };
  e.zero_runs = [](Device d, float* base, const FloatRun* runs, int64_t count) {
    zero_runs(base, runs, count, stream_of(d));
  };
  e.sum_of_squares = [](Device d, const float* x, int64_t n) { return sum_of_squares(x, n, stream_of(d)); };
  e.profiler_capture = [](Device d, bool start) {
    stream_of(d);  // d current on this thread: the capture is of its context
    check_cuda(start ? cudaProfilerStart() : cudaProfilerStop(), start ? "cudaProfilerStart" : "cudaProfilerStop");
  };
  e.scale_in_place = [](Device d, float* x, int64_t n, float f) { scale_in_place(x, n, f, stream_of(d)); };
  e.add_in_place = [](Device d, float* y, const float* x, int64_t n) { add_in_place(y, x, n, stream_of(d)); };
  e.nesterov_outer_update = [](Device d, float* anchor, float* momentum, const float* delta, int64_t n, float lr,
                               float mu) { nesterov_outer_update(anchor, momentum, delta, n, lr, mu, stream_of(d)); };
  e.amax_into = [](Device d, float* dst, const float* x, int64_t n) { amax_into(dst, x, n, stream_of(d)); };
  e.amax_into_bf16 = [](Device d, float* dst, const void* x16, int64_t n) {
    amax_into_bf16(dst, x16, n, stream_of(d));
  };
  e.narrow_floats = [](Device d, void* dst, const float* src, int64_t n, DType dtype) {
    narrow_floats(dst, src, n, dtype, stream_of(d));
  };
  e.widen_floats = [](Device d, float* dst, const void* src, int64_t n, DType dtype, bool accumulate) {
    widen_floats(dst, src, n, dtype, accumulate, stream_of(d));
  };
}

void register_mamba(CudaEntries& e) {
  e.ssd_scan_forward = [](Device d, float* y, const float* x, const float* dt_raw, const float* dt_bias,
                          const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                          const int32_t* documents) {
    ssd_scan_forward(y, x, dt_raw, dt_bias, A_log, B, C, D, s, documents, stream_of(d));
  };
  e.ssd_scan_backward = [](Device d, float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC,
                           float* dD, const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                           const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                           const int32_t* documents) {
    ssd_scan_backward(dx, ddt_raw, ddt_bias, dA_log, dB, dC, dD, dy, x, dt_raw, dt_bias, A_log, B, C, D, s, documents,
                      stream_of(d));
  };
  e.ssd_scan_step = [](Device d, float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                       const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                       const SsdShape& s) {
    ssd_scan_step(y, state, slots, x, dt_raw, dt_bias, A_log, B, C, D, s, stream_of(d));
  };
  e.causal_conv_silu_forward = [](Device d, float* out, const float* in, const float* w, const float* b,
                                  const ConvShape& s, const int32_t* documents) {
    causal_conv_silu_forward(out, in, w, b, s, documents, stream_of(d));
  };
  e.causal_conv_silu_backward = [](Device d, float* din, float* dw, float* db, const float* dout, const float* in,
                                   const float* w, const float* b, const ConvShape& s, const int32_t* documents) {
    causal_conv_silu_backward(din, dw, db, dout, in, w, b, s, documents, stream_of(d));
  };
  e.causal_conv_silu_step = [](Device d, float* out, float* window, const int32_t* slots, const float* in,
                               const float* w, const float* b, const ConvShape& s) {
    causal_conv_silu_step(out, window, slots, in, w, b, s, stream_of(d));
  };
  e.gated_rmsnorm_forward = [](Device d, float* out, float* rstd, const float* y, const float* z, int64_t zs,
                               const float* w, int64_t rows, int64_t dim, int64_t group, float eps) {
    gated_rmsnorm_forward(out, rstd, y, z, zs, w, rows, dim, group, eps, stream_of(d));
  };
  e.gated_rmsnorm_backward = [](Device d, float* dy, float* dz, float* dw, const float* dout, const float* y,
                                const float* z, int64_t zs, const float* w, const float* rstd, int64_t rows,
                                int64_t dim, int64_t group) {
    gated_rmsnorm_backward(dy, dz, dw, dout, y, z, zs, w, rstd, rows, dim, group, stream_of(d));
  };
}

void register_precision(CudaEntries& e) {
  e.amax = [](Device d, const float* x, int64_t n) { return amax(x, n, stream_of(d)); };
  e.round_in_place = [](Device d, float* x, int64_t n, OutputRounding rounding) {
    round_in_place(x, n, rounding, stream_of(d));
  };
  e.precision_linear_gemm = [](Device d, const PrecisionGemm& g) { precision_linear_gemm(g, stream_of(d)); };
  e.precision_linear_gemms = [](Device d, const PrecisionGemm* gemms, int64_t count) {
    precision_linear_gemms(gemms, count, stream_of(d));
  };
  e.activation_forward_codes = [](Device d, MlpActivation a, const void* in16, int64_t rows, int64_t width,
                                  const CastOperand& cast, void* codes, void* transposed) {
    activation_forward_codes(a, in16, rows, width, cast, codes, transposed, stream_of(d));
  };
  e.activation_backward_codes = [](Device d, MlpActivation a, const void* dout16, const void* in16, int64_t rows,
                                   int64_t width, const CastOperand& cast, void* codes, void* transposed) {
    activation_backward_codes(a, dout16, in16, rows, width, cast, codes, transposed, stream_of(d));
  };
  e.norm_statistics = [](Device d, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                          int64_t rows, int64_t dim, float eps, float* amax) {
    norm_statistics(mean, rstd, in, weight, bias, rows, dim, eps, amax, stream_of(d));
  };
  e.norm_forward_codes = [](Device d, const float* in, const float* weight, const float* bias, const float* mean,
                             const float* rstd, int64_t rows, int64_t dim, const CastOperand& cast, void* codes,
                             void* transposed) {
    norm_forward_codes(in, weight, bias, mean, rstd, rows, dim, cast, codes, transposed, stream_of(d));
  };
}

}  // namespace

void register_kernels(CudaEntries& entries) {
  register_norms_and_activations(entries);
  register_rows_and_routing(entries);
  register_embedding_and_rope(entries);
  register_products(entries);
  register_attention(entries);
  register_loss_and_optimizer(entries);
  register_precision(entries);
  register_mamba(entries);
}

}  // namespace loom::kernels::cuda
