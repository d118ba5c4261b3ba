#pragma once
// Self-attention sub-block: q/k/v projections (fused into one column-parallel GEMM), RoPE,
// causal GQA attention over this rank's heads (the tiled kernel: only the output and each query's
// log-sum-exp are kept, so memory grows linearly with the sequence; packed documents stay apart),
// output projection (row-parallel) added into the residual stream. Tensor parallelism splits the heads; when there are fewer kv heads than
// ranks each kv head is replicated on the ranks whose query heads read it.
#include <optional>
#include <string>

#include "loom/kernels/types.h"
#include "loom/model/buffers.h"
#include "loom/model/context_attention.h"
#include "loom/model/norm.h"
#include "loom/model/paged.h"
#include "loom/model/packing.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

// Keys and values of past positions for one sequence, [position, kv_heads*head_dim]; a Mamba
// layer keeps its recurrent state instead.
struct KVCache {
  Buffer keys, values;
  MambaCache mamba;
};

class Attention {
 public:
  struct Saved {
    Buffer qkv, lse, att;
    Buffer qkv_codes, out_codes;  // the projections' FP8 input codes, where they keep them (DeviceTensors)
    ContextSaved context;  // context parallelism's
  };
  // Throws naming the layer when its heads cannot be split over the tensor-parallel group.
  Attention(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix, int d_model,
            int heads, int kv_heads, bool qkv_bias, bool out_bias, const kernels::RopeTable* rope, float init_std, float out_std);
  // residual[local rows] += o_proj(attention(normed)); normed is this rank's rows of [batch*seq,
  // d_model], in bf16 where takes_bf16_input(), as FP8 codes where takes_input_codes() and the
  // norm wrote them. `residual_in` (null: residual): residual = residual_in + o_proj(...) instead
  // (RowParallelLinear::forward's). `out16` (where gives_bf16_output()): o_proj(...) left there in
  // bf16 (rounded after its bias) instead, residual not written (the norm after adds it).
  void forward(Saved& saved, float* residual, const NormedRows& normed, int64_t batch, int64_t seq,
               const Packing& packing, ParallelScratch& scratch, const float* residual_in = nullptr,
               void* out16 = nullptr) const;
  // Whether the forward can leave its output projection's product in bf16: bf16 tensors and an
  // output projection that can (RowParallelLinear::gives_bf16_output).
  bool gives_bf16_output() const { return bf16_tensors() && out_->gives_bf16_output(); }
  // d_normed = d/d(normed) (written whole), given d_residual; parameter gradients into the store.
  // `d_normed16` (where gives_bf16_input_grad()): d_normed written whole in bf16 there instead
  // (d_normed may be null then). `d_residual16` (where takes_bf16_residual_grad()): d_residual's
  // values in bf16, which the output projection's GEMMs multiply; `d_residual_amax` (where
  // takes_residual_grad_amax()): d_residual's amax, taken by its producer in the slot
  // residual_grad_amax() gave (ResidualGradForReader).
  void backward(float* d_normed, const float* d_residual, const NormedRows& normed, const Saved& saved,
                Workspace& work, int64_t batch, int64_t seq, const Packing& packing, ParallelScratch& scratch,
                void* d_normed16 = nullptr, const void* d_residual16 = nullptr,
                const float* d_residual_amax = nullptr) const;
  // Whether the backward can leave d_normed in bf16 (the q/k/v projection's, ColumnParallelLinear's).
  bool gives_bf16_input_grad() const { return qkv_->gives_bf16_input_grad(); }
  // Whether it takes d_residual in bf16 too: bf16 tensors and an output projection that takes it.
  bool takes_bf16_residual_grad() const { return bf16_tensors() && out_->takes_bf16_output_grad(); }
  // Whether the output projection takes d_residual's amax from its producer
  // (RowParallelLinear::takes_output_grad_amax); then where, asked just before that producer.
  bool takes_residual_grad_amax() const { return out_->takes_output_grad_amax(); }
  float* residual_grad_amax() const { return out_->output_grad_amax(); }
  // Whether training may hand the normed input over in bf16: the q/k/v projection's GEMMs are
  // bf16 on a GPU, so it casts the input to bf16 anyway (for the forward and the weight gradient).
  bool takes_bf16_input() const { return qkv_->takes_bf16_input(); }
  // Whether the norm before it writes the q/k/v projection's input as FP8 codes itself
  // (Norm::forward_codes: per-tensor FP8 on a GPU, no sequence parallelism); then where the norm
  // takes its outputs' amax first (fp8_current; null under fp8_delayed, whose codes' pass takes it)
  // and where it writes the codes (ColumnParallelLinear::input_codes; the transposed ones kept in
  // `saved` for the weight gradient), handed over as NormedRows::in_codes.
  bool takes_input_codes() const { return qkv_->takes_input_codes(); }
  float* input_amax() const { return qkv_->input_amax(); }
  LinearPrecision::ProducedCodes input_codes(Saved& saved, int64_t rows) const {
    return qkv_->input_codes(saved.qkv_codes, rows);
  }
  // Inference (one rank) on `rows` new positions of one sequence, appending to the cache (which
  // holds `past`); the projections in their precision recipe, as forward_paged's.
  void decode(float* residual, const float* normed, int64_t rows, int64_t past, KVCache& cache,
              Saved& scratch, ParallelScratch& tp_scratch, int64_t max_positions) const;
  // Inference on a batch step: writes the rows' keys/values into the paged cache, attends each
  // row over its sequence's positions [0, position] and adds o_proj into residual (any tp).
  // `on_device`: the batch's metadata where the kernels read it.
  void forward_paged(float* residual, const float* normed, const PagedBatch& batch, const PagedRows& on_device,
                     PagedLayerCache& cache, int64_t block_size, Saved& scratch, ParallelScratch& tp_scratch) const;
  int64_t local_kv_width() const { return static_cast<int64_t>(kv_heads_) * head_dim_; }
  // Precision recipe of the q/k/v and output projections' GEMMs.
  // `prefix`: the module's name (model.layers.N.self_attn), naming its GEMMs' precision state.
  void set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix);
  // Context parallelism: the sequence's rows are spread over a group and attention spans it
  // through `context` (null: this rank holds whole sequences). Throws naming the layer when its
  // heads cannot be split as `context` needs.
  void set_context(ContextAttention* context) { context_ = context; }
  // What training's attention products take (PrecisionPolicy::attention_operands); fp32 unless set.
  void set_operands(kernels::AttentionOperands operands) { operands_ = operands; }
  // Whether training keeps the attention's tensors bf16: on a GPU under the bf16 recipe or
  // per-tensor FP8 (fp8_delayed, fp8_current) with bf16 attention operands and no context
  // parallelism, q/k/v (the projection's bf16 output, rotated by rope_forward_bf16) and the
  // attention output (both saved for backward) and the output's gradient are bf16 tensors handed
  // between the projections (DeviceTensors) and the attention kernels
  // (kernels::flash_attention_forward_bf16_tensors) as they are: the values the fp32 path has
  // anyway (the projection's output rounded; q, k, v and the output's gradient cast to bf16 by
  // attention; its output widened from bf16 and cast back by the projection, or under FP8 its
  // codes cast from those bf16 values), without those passes and with half the bytes.
  bool bf16_tensors() const;
  // Whether, beyond that, the q/k/v gradient is a bf16 tensor: under the bf16 recipe (the q/k/v
  // projection casts its output gradient to bf16 anyway). Attention's backward writes it whole in
  // bf16 (kernels::flash_attention_backward_bf16_gradients), undoing RoPE on q and k before it
  // rounds them, or summing a bias's gradient from the fp32 values (not both: a RoPE model with a
  // q/k/v bias keeps the fp32 gradient): no zeroing, no widening of cuDNN's bf16 gradients, no
  // separate rotation, no cast, half the bytes. Not for kv heads replicated over ranks, whose
  // partial gradients are summed in fp32 before they are rounded (sums_replicated_kv_grads).
  bool bf16_gradients() const;

 private:
  int64_t qkv_width() const { return static_cast<int64_t>(heads_ + 2 * kv_heads_) * head_dim_; }
  // RoPE (or its backward) on q and k of every row at the tokens' positions: `positions` when
  // given (packed documents), else their global places in the sequence. qkv: fp32, or bf16 for
  // ForwardBf16 (rope_forward_bf16).
  enum class Rotation : uint8_t { Forward, Backward, ForwardBf16 };
  void rotate(void* qkv, int64_t batch, int64_t seq, Rotation how, const int32_t* positions) const;
  kernels::FlashAttentionShape flash_shape(int64_t batch, int64_t seq) const;
  // Whether the backward sums the gradients of kv heads replicated over ranks before the q/k/v
  // projection's: each holder's covers its own query heads only, and a quantizing recipe must cast
  // the whole gradient, as one rank does (fp32 needs no sum first: its GEMMs are linear in it).
  bool sums_replicated_kv_grads() const;
  // d_qkv's k and v columns [rows, 2 kv_heads_ head_dim]: on the first of each kv head's holders
  // their sum over the holders (fp32), on the others zeros.
  void sum_replicated_kv_grads(float* d_qkv, int64_t rows, ParallelScratch& scratch) const;
  ParameterStore* store_;
  const TensorParallel* tp_;
  int d_model_, heads_, kv_heads_, head_dim_;  // heads_ and kv_heads_: this rank's
  // The ranks holding each kv head, the kv heads of all ranks, and this rank's first kv head.
  int kv_replicas_ = 1, kv_heads_total_ = 0, first_kv_ = 0;
  const kernels::RopeTable* rope_;             // null for learned positions
  ContextAttention* context_ = nullptr;
  kernels::AttentionOperands operands_ = kernels::AttentionOperands::Fp32;
  int qkv_weight_ = -1, qkv_bias_ = -1, out_weight_ = -1, out_bias_ = -1;
  std::optional<ColumnParallelLinear> qkv_;
  std::optional<RowParallelLinear> out_;
};

}  // namespace loom::model
