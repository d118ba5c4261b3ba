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

class Block;

// What the norm backward that updates the residual stream's gradient d_x writes besides d_x, from
// the same pass, for the output projection whose backward reads d_x next (attention's or the
// MLP's; the block before's after a block's first norm):
// - under the bf16 recipe on a GPU, d_x in bf16 (Workspace::d_residual16, kernels::rmsnorm_backward's
//   din16): that projection's GEMMs multiply these values instead of casting d_x to bf16
//   themselves, a read of the fp32 gradient fewer; the same values, so the same products;
// - under fp8_current on a GPU, d_x's amax (din_amax), in the slot that projection's
//   residual_grad_amax() gives: its cast of d_x then takes no pass over d_x for the amax first;
//   the same amax, so the same codes.
struct ResidualGradForReader {
  // The block before, whose backward reads d_x next (null: none, or d_x changes before it does):
  // the last norm to update d_x writes what it takes (Block::takes_bf16_residual_grad,
  // takes_residual_grad_amax).
  const Block* reader = nullptr;
  bool current = false;         // work.d_residual16 holds d_x's values as they are now
  const float* amax = nullptr;  // where d_x's amax as d_x is now was taken (null: nowhere)
  bool reader_takes_bf16() const;
  // The reader's amax slot, asked just before the norm that takes it runs (null: it takes none).
  float* reader_amax() const;
};

// How a block's forward meets the residual add between it and the block before: where the block
// before can leave its MLP's product in bf16 and this block's first norm writes bf16 for attention,
// the block before writes no output and this block's norm adds that product to the stream as it
// reads it (Norm::forward_added: the add's and the norm's values, one read of the stream fewer).
struct ResidualLink {
  // The input still to be added (residual null: none): x_in = residual + product16, written into
  // `sum` (x_in itself) by the first norm.
  const float* residual = nullptr;
  const void* product16 = nullptr;
  float* sum = nullptr;
  // Leave the MLP's product in bf16 in scratch.product16 rather than writing x_out, for the next
  // block (x_out is then saved.mid + that product, yet to be written).
  bool leave_product = false;
};

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
  // `link`: the residual add left by the block before, and whether to leave one for the next.
  void forward(Saved& saved, const float* x_in, float* x_out, int64_t batch, int64_t seq, const Packing& packing,
               ParallelScratch& scratch, const ResidualLink& link = {}) const;
  // What a ResidualLink can ask of the block: to leave its MLP's product (one rank, a product
  // rounded to bf16, after attention: its mid kept), and to add the block before's as its first
  // norm reads its input (that norm writing bf16 for attention).
  bool leaves_product() const;
  bool adds_product_in() const;
  // d_x holds d(loss)/d(x_out) on entry and d(loss)/d(x_in) on return. `for_reader` says whether
  // work.d_residual16 holds d_x in bf16 and where d_x's amax is, on entry and on return (written
  // for for_reader.reader).
  void backward(float* d_x, ResidualGradForReader& for_reader, const float* x_in, const Saved& saved,
                Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                ParallelScratch& scratch) const;
  // Whether the backward reads d_x in bf16 first (its MLP's, else its attention's output projection).
  bool takes_bf16_residual_grad() const;
  // Whether that projection takes d_x's amax from d_x's producer; then where, asked just before it.
  bool takes_residual_grad_amax() const;
  float* residual_grad_amax() const;
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
    if (mamba_) mamba_->set_context(context);
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
