#pragma once
// One transformer layer: x_mid = x + attention(norm1(x)); x_out = x_mid + mlp(norm2(x_mid)).
// Either sub-block may be absent (heterogeneous layers). A hybrid layer has a Mamba-2 mixer in
// attention's place (x_out = x + mixer(norm1(x)), no MLP: Nemotron-H's one mixer per layer).
#include <optional>
#include <string>

#include "loom/model/attention.h"
#include "loom/model/layer_spec.h"
#include "loom/model/mamba2_mixer.h"
#include "loom/model/mlp.h"
#include "loom/model/moe_layer.h"
#include "loom/model/norm.h"

namespace loom::model {

class Block {
 public:
  struct Saved {
    Norm::Saved norm1, norm2;
    Attention::Saved attention;
    Mlp::Saved mlp;
    Mamba2Mixer::Saved mamba;
    MoeLayer::Saved moe;
    Buffer mid;
  };
  Block(ParameterStore& store, const TensorParallel& tp, int layer, const config::ModelConfig& config,
        const LayerSpec& spec, const kernels::RopeTable* rope, ExpertLayout experts = {},
        const std::string& prefix = "");  // empty: model.layers.<layer>

  // x_in / x_out: this rank's rows of the residual stream (all of them unless sequence parallel).
  void forward(Saved& saved, const float* x_in, float* x_out, int64_t batch, int64_t seq, const Packing& packing,
               ParallelScratch& scratch) const;
  // d_x holds d(loss)/d(x_out) on entry and d(loss)/d(x_in) on return.
  void backward(float* d_x, const float* x_in, const Saved& saved, Workspace& work, int64_t batch, int64_t seq,
                const Packing& packing, ParallelScratch& scratch) const;
  // Inference on `rows` new positions of one sequence; x is updated in place.
  void decode(float* x, int64_t rows, int64_t past, KVCache& cache, Saved& scratch, ParallelScratch& tp_scratch,
              int64_t max_positions) const;
  // A paged batch step (see paged.h); x [rows, d_model] is updated in place. `cache` is unused
  // by a layer without attention or Mamba-2 mixer.
  void forward_paged(float* x, const PagedBatch& batch, const PagedRows& on_device, PagedLayerCache& cache,
                     int64_t block_size, Saved& scratch, ParallelScratch& tp_scratch) const;
  // This rank's key (= value) width of the layer's cache rows, 0 without attention.
  int64_t local_kv_width() const { return attention_ ? attention_->local_kv_width() : 0; }
  // This rank's floats of one sequence's Mamba convolution window and scan state, 0 without a mixer.
  int64_t local_window_width() const { return mamba_ ? mamba_->window_width() : 0; }
  int64_t local_state_width() const { return mamba_ ? mamba_->state_width() : 0; }
  // Precision recipe of the layer's linear GEMMs (linear_precision.h); fp32 unless called.
  void set_precision(PrecisionContext& context, Recipe recipe);
  // Context parallelism's attention over the group (context_attention.h); null: none.
  void set_context(ContextAttention* context) {
    if (attention_) attention_->set_context(context);
  }
  void set_attention_operands(kernels::AttentionOperands operands) {
    if (attention_) attention_->set_operands(operands);
  }
  // The layer's mixture of experts (null: a dense MLP or none).
  MoeLayer* moe() { return moe_ ? &*moe_ : nullptr; }
  const MoeLayer* moe() const { return moe_ ? &*moe_ : nullptr; }

 private:
  const TensorParallel* tp_;
  std::string prefix_;  // model.layers.N
  std::optional<Norm> norm1_, norm2_;
  std::optional<Attention> attention_;
  std::optional<Mlp> mlp_;
  std::optional<Mamba2Mixer> mamba_;
  std::optional<MoeLayer> moe_;
  int d_model_;
  Device device_;  // the store's: where the block's activations live
};

}  // namespace loom::model
