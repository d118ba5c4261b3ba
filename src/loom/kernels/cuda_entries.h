#pragma once
// The CUDA kernels the device-neutral entries (ops.h) reach. Empty in every build until the CUDA
// backend starts (kernels/cuda/backend.h fills it, with the caching allocators); an entry that
// stays null has no CUDA kernel yet and its op throws. Each kernel runs on the device's compute
// stream (see docs/architecture.md, "The device seam").
#include <cstdint>

#include "loom/core/device.h"
#include "loom/core/dtype.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/kernels/types.h"

namespace loom::kernels {

struct CudaEntries {
  void (*embedding_forward)(Device, float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                            bool accumulate) = nullptr;
  void (*embedding_backward)(Device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                             int64_t dim) = nullptr;
  void (*embedding_forward_shard)(Device, float* out, const int32_t* ids, const float* table, int64_t rows,
                                  int64_t dim, int64_t first_id, int64_t count) = nullptr;
  void (*embedding_backward_shard)(Device, float* dtable, const float* dout, const int32_t* ids, int64_t rows,
                                   int64_t dim, int64_t first_id, int64_t count) = nullptr;
  void (*layernorm_forward)(Device, float* out, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps) = nullptr;
  void (*layernorm_backward)(Device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                             const float* weight, const float* mean, const float* rstd, int64_t rows,
                             int64_t dim, void* din16, float* din_amax) = nullptr;
  void (*layernorm_forward_bf16)(Device, void* out16, float* mean, float* rstd, const float* in, const float* weight,
                                 const float* bias, int64_t rows, int64_t dim, float eps) = nullptr;
  void (*rope_forward)(Device, float* x, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                       int64_t seq, int64_t positions_start, const RopeTable& table,
                       const int32_t* positions) = nullptr;
  void (*rope_backward)(Device, float* dx, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                        int64_t seq, int64_t positions_start, const RopeTable& table,
                        const int32_t* positions) = nullptr;
  void (*rope_forward_bf16)(Device, void* x16, int64_t rows, int64_t row_stride, int64_t first_col, int64_t heads,
                            int64_t seq, int64_t positions_start, const RopeTable& table,
                            const int32_t* positions) = nullptr;
  void (*linear_forward)(Device, float* out, const float* in, const float* weight, const float* bias, int64_t n,
                         int64_t in_features, int64_t out_features, bool accumulate) = nullptr;
  void (*linear_backward)(Device, float* din, float* dweight, float* dbias, const float* dout, const float* in,
                          const float* weight, int64_t n, int64_t in_features, int64_t out_features,
                          bool accumulate_din, bool accumulate_dweight) = nullptr;
  void (*add_bias)(Device, float* x, const float* bias, int64_t rows, int64_t width) = nullptr;
  void (*gemm_nt)(Device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k,
                  bool accumulate) = nullptr;
  void (*gemm)(Device, float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
               bool trans_b, bool accumulate) = nullptr;
  double (*softmax_cross_entropy)(Device, float* logits, float* losses, const int32_t* targets, int64_t rows,
                                  int64_t vocab, float grad_scale) = nullptr;
  double (*softmax_cross_entropy_bf16)(Device, void* logits, float* losses, const int32_t* targets, int64_t rows,
                                       int64_t vocab, float grad_scale) = nullptr;
  void (*vocab_shard_row_max)(Device, const float* logits, int64_t rows, int64_t vocab_shard,
                              float* row_max) = nullptr;
  void (*vocab_shard_exp_sums)(Device, const float* logits, const float* row_max, const int32_t* targets,
                               int64_t rows, int64_t vocab_shard, int64_t first_id, float* stats) = nullptr;
  void (*vocab_shard_gradient)(Device, float* logits, const float* row_max, const float* stats,
                                const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                                const float* row_scale) = nullptr;
  double (*vocab_shard_finish)(Device, float* logits, float* losses, const float* row_max, const float* stats,
                               const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                               float grad_scale) = nullptr;
  double (*sum_of_squares)(Device, const float* x, int64_t n) = nullptr;
  void (*scale_in_place)(Device, float* x, int64_t n, float factor) = nullptr;
  void (*add_in_place)(Device, float* y, const float* x, int64_t n) = nullptr;
  void (*nesterov_outer_update)(Device, float* anchor, float* momentum, const float* delta, int64_t n, float lr,
                                float mu) = nullptr;
  void (*amax_into)(Device, float* dst, const float* x, int64_t n) = nullptr;
  void (*amax_into_bf16)(Device, float* dst, const void* x16, int64_t n) = nullptr;
  void (*narrow_floats)(Device, void* dst, const float* src, int64_t n, DType dtype) = nullptr;
  void (*widen_floats)(Device, float* dst, const void* src, int64_t n, DType dtype, bool accumulate) = nullptr;
  void (*adamw_update_many)(Device, const AdamWTensor* tensors, int64_t count, const AdamWStep* steps,
                            int64_t step_count) = nullptr;
  void (*zero_runs)(Device, float* base, const FloatRun* runs, int64_t count) = nullptr;
  void (*rmsnorm_forward)(Device, float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                          int64_t dim, float eps) = nullptr;
  void (*rmsnorm_backward)(Device, float* din, float* dweight, const float* dout, const float* in,
                           const float* weight, const float* rstd, int64_t rows, int64_t dim, void* din16,
                           float* din_amax) = nullptr;
  void (*rmsnorm_forward_bf16)(Device, void* out16, float* rstd, const float* in, const float* weight, int64_t rows,
                               int64_t dim, float eps) = nullptr;
  void (*rmsnorm_add_forward_bf16)(Device, void* out16, float* rstd, float* sum, const float* residual,
                                   const void* add16, const float* weight, int64_t rows, int64_t dim,
                                   float eps) = nullptr;
  void (*layernorm_add_forward_bf16)(Device, void* out16, float* mean, float* rstd, float* sum, const float* residual,
                                     const void* add16, const float* weight, const float* bias, int64_t rows,
                                     int64_t dim, float eps) = nullptr;
  void (*rmsnorm_backward_bf16)(Device, float* din, float* dweight, const void* dout16, const float* in,
                                const float* weight, const float* rstd, int64_t rows, int64_t dim,
                                void* din16, float* din_amax) = nullptr;
  void (*layernorm_backward_bf16)(Device, float* din, float* dweight, float* dbias, const void* dout16,
                                  const float* in, const float* weight, const float* mean, const float* rstd,
                                  int64_t rows, int64_t dim, void* din16, float* din_amax) = nullptr;
  void (*adamw_update)(Device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                       const AdamWStep& step) = nullptr;
  void (*swiglu_forward)(Device, float* out, const float* gate_up, int64_t rows, int64_t width) = nullptr;
  void (*swiglu_backward)(Device, float* dgate_up, const float* dout, const float* gate_up, int64_t rows,
                          int64_t width) = nullptr;
  void (*gelu_forward)(Device, float* out, const float* in, int64_t n) = nullptr;
  void (*gelu_backward)(Device, float* din, const float* dout, const float* in, int64_t n) = nullptr;
  void (*relu2_forward)(Device, float* out, const float* in, int64_t n) = nullptr;
  void (*relu2_backward)(Device, float* din, const float* dout, const float* in, int64_t n) = nullptr;
  void (*activation_forward_bf16)(Device, MlpActivation, float* out, void* out16, const void* in16, int64_t rows,
                                  int64_t width, float* amax) = nullptr;
  void (*activation_backward_bf16)(Device, MlpActivation, float* din, void* din16, float* dbias, const void* dout16,
                                   const void* in16, int64_t rows, int64_t width, float* amax) = nullptr;
  void (*add_rows)(Device, float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows,
                   int64_t width) = nullptr;
  void (*gather_rows)(Device, float* out, const float* x, const int32_t* index, const float* scale, int64_t rows,
                      int64_t width) = nullptr;
  void (*scatter_add_rows)(Device, float* out, const float* x, int64_t x_stride, const int32_t* index,
                           const float* scale, int64_t rows, int64_t width) = nullptr;
  void (*row_dots)(Device, double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride,
                   int64_t rows, int64_t width) = nullptr;
  void (*sigmoid_gate)(Device, float* gate, const double* logits, int64_t n) = nullptr;
  void (*sigmoid_gate_backward)(Device, float* d_logit, const double* dots, const float* gate, int64_t n) = nullptr;
  void (*moe_router_forward)(Device, const RouterForward& r) = nullptr;
  void (*moe_router_backward)(Device, float* d_logits, const RouterBackward& r) = nullptr;
  // Mamba-2's mixer: the contracts of kernels/cpu/ssd_scan.h, causal_conv.h and gated_norm.h.
  void (*ssd_scan_forward)(Device, float* y, const float* x, const float* dt_raw, const float* dt_bias,
                           const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                           const int32_t* documents) = nullptr;
  void (*ssd_scan_backward)(Device, float* dx, float* ddt_raw, float* ddt_bias, float* dA_log, float* dB, float* dC,
                            float* dD, const float* dy, const float* x, const float* dt_raw, const float* dt_bias,
                            const float* A_log, const float* B, const float* C, const float* D, const SsdShape& s,
                            const int32_t* documents) = nullptr;
  void (*ssd_scan_step)(Device, float* y, float* state, const int32_t* slots, const float* x, const float* dt_raw,
                        const float* dt_bias, const float* A_log, const float* B, const float* C, const float* D,
                        const SsdShape& s) = nullptr;
  void (*causal_conv_silu_forward)(Device, float* out, const float* in, const float* weight, const float* bias,
                                   const ConvShape& s, const int32_t* documents) = nullptr;
  void (*causal_conv_silu_backward)(Device, float* din, float* dweight, float* dbias, const float* dout,
                                    const float* in, const float* weight, const float* bias, const ConvShape& s,
                                    const int32_t* documents) = nullptr;
  void (*causal_conv_silu_step)(Device, float* out, float* window, const int32_t* slots, const float* in,
                                const float* weight, const float* bias, const ConvShape& s) = nullptr;
  void (*gated_rmsnorm_forward)(Device, float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                                const float* weight, int64_t rows, int64_t dim, int64_t group_size,
                                float eps) = nullptr;
  void (*gated_rmsnorm_backward)(Device, float* dy, float* dz, float* dweight, const float* dout, const float* y,
                                 const float* z, int64_t z_stride, const float* weight, const float* rstd,
                                 int64_t rows, int64_t dim, int64_t group_size) = nullptr;
  // Tiled attention: the contract of kernels/ops.h (and docs/architecture.md, "Kernels").
  void (*flash_attention_forward)(Device, float* out, float* lse, const float* q, const float* k, const float* v,
                                  const FlashAttentionShape& s, const AttentionVisibility& vis) = nullptr;
  void (*flash_attention_backward)(Device, float* dq, float* dk, float* dv, const float* dout, const float* out,
                                   const float* lse, const float* q, const float* k, const float* v,
                                   const FlashAttentionShape& s, const AttentionVisibility& vis) = nullptr;
  void (*flash_attention_forward_bf16_tensors)(Device, void* out16, float* lse, const void* q16, const void* k16,
                                               const void* v16, const FlashAttentionShape& s,
                                               const AttentionVisibility& vis) = nullptr;
  void (*flash_attention_backward_bf16_tensors)(Device, float* dq, float* dk, float* dv, const void* dout16,
                                                const void* out16, const float* lse, const void* q16,
                                                const void* k16, const void* v16, const FlashAttentionShape& s,
                                                const AttentionVisibility& vis) = nullptr;
  void (*flash_attention_backward_bf16_gradients)(Device, void* dq16, void* dk16, void* dv16, float* dbias_q,
                                                  float* dbias_k, float* dbias_v, const void* dout16,
                                                  const void* out16, const float* lse, const void* q16,
                                                  const void* k16, const void* v16, const FlashAttentionShape& s,
                                                  const AttentionVisibility& vis,
                                                  const QkvRotation& rotation) = nullptr;
  void (*flash_attention_backward_fp32_gradients)(Device, float* dq, float* dk, float* dv, const void* dout16,
                                                  const void* out16, const float* lse, const void* q16,
                                                  const void* k16, const void* v16, const FlashAttentionShape& s,
                                                  const AttentionVisibility& vis, const QkvRotation& rotation,
                                                  float* amax) = nullptr;
  void (*merge_attention_partials)(Device, float* out, float* lse, const float* part_out, const float* part_lse,
                                   const FlashAttentionShape& s) = nullptr;
  // Attention over a paged KV cache and the writes into it (inference), and over one sequence's
  // contiguous cache (loom generate).
  void (*attention_decode)(Device, float* out, const float* q, int64_t q_stride, const float* k_cache,
                           const float* v_cache, int64_t past, int64_t new_tokens, int64_t heads, int64_t kv_heads,
                           int64_t head_dim) = nullptr;
  void (*paged_attention)(Device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                          const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                          const int32_t* positions, int64_t rows, const PagedAttentionShape& shape) = nullptr;
  void (*paged_prompt_attention)(Device, float* out, const float* q, int64_t q_stride, const void* k_pool,
                                 const void* v_pool, const int32_t* block_tables, const int32_t* sequences,
                                 const int32_t* positions, const int32_t* tiles, int64_t tile_count, int64_t reach,
                                 const PagedAttentionShape& shape) = nullptr;
  void (*paged_cache_write)(Device, void* k_pool, void* v_pool, const float* k, const float* v, int64_t stride,
                            const int32_t* block_tables, const int32_t* sequences, const int32_t* positions,
                            int64_t rows, const PagedAttentionShape& shape) = nullptr;
  // The precision recipes' linear GEMMs (precision_gemm.h).
  float (*amax)(Device, const float* x, int64_t n) = nullptr;
  void (*round_in_place)(Device, float* x, int64_t n, OutputRounding rounding) = nullptr;
  void (*precision_linear_gemm)(Device, const PrecisionGemm& gemm) = nullptr;
  void (*precision_linear_gemms)(Device, const PrecisionGemm* gemms, int64_t count) = nullptr;
  void (*activation_forward_codes)(Device, MlpActivation, const void* in16, int64_t rows, int64_t width,
                                   const CastOperand& cast, void* codes, void* transposed) = nullptr;
  void (*activation_backward_codes)(Device, MlpActivation, const void* dout16, const void* in16, int64_t rows,
                                    int64_t width, const CastOperand& cast, void* codes, void* transposed) = nullptr;
  void (*norm_statistics)(Device, float* mean, float* rstd, const float* in, const float* weight, const float* bias,
                          int64_t rows, int64_t dim, float eps, float* amax) = nullptr;
  void (*norm_forward_codes)(Device, const float* in, const float* weight, const float* bias, const float* mean,
                             const float* rstd, int64_t rows, int64_t dim, const CastOperand& cast, void* codes,
                             void* transposed) = nullptr;
  // cudaProfilerStart (start) or cudaProfilerStop on the device: what Nsight Systems captures
  // under --capture-range=cudaProfilerApi.
  void (*profiler_capture)(Device, bool start) = nullptr;
  bool started = false;  // whether a CUDA backend registered at all
  int devices = 0;       // the GPUs it serves: Device::cuda(0) .. cuda(devices - 1)
};

// Written once at start-up, before any op runs on a GPU; read by every dispatch.
CudaEntries& cuda_entries();

// How this binary starts its CUDA backend: kernels::cuda::start_backend where the binary is built
// with it (the `loom` executable sets it first thing); none elsewhere.
using CudaStarter = void (*)();
void set_cuda_starter(CudaStarter starter);
// Starts the backend once (nothing to do when one already serves Device::cuda) and returns how
// many GPUs it serves. Throws loom::Error when this binary has no CUDA backend, or, from the
// backend, with the runtime's reason when no GPU is usable.
int start_cuda();

}  // namespace loom::kernels
