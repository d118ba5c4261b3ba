#pragma once
// This rank's routed experts as one grouped GEMM: rows arrive grouped by expert (expert_rows[j]
// rows for local expert j, back to back) and each expert is an MLP over its
// contiguous row range, one BLAS GEMM per expert and projection through kernels/ops.h. The
// activation is the model's (SwiGLU, GELU, or squared ReLU: Nemotron-H's latent MoE). Each
// expert's parameters are global tensors of their own (model.layers.N.mlp.experts.E.*), so a
// checkpoint loads into any expert-parallel size. Expert GEMMs run in fp32, or in the block's
// precision recipe (set_precision): each expert's two projections are linears of their own
// (model.layers.N.mlp.experts.E.up_proj / down_proj), their operands cast and outputs rounded as
// a dense MLP's, their weight gradients added unrounded into the fp32 main gradients.
//
// Under the FP8 recipes, whose products on a GPU take only row counts of a multiple of 16 (128 for
// fp8_blockwise), each expert's rows are padded with zero rows to that multiple in ExpertScratch
// (as Transformer Engine pads a grouped GEMM's splits), on every device alike: a zero row adds
// nothing to an amax, a block's scale, a product or a weight gradient.
//
// The activation runs once over every expert's rows (one launch: the same function for all), and
// under the bf16 recipe on a GPU the interior is bf16 (bf16_interior, as Mlp::bf16_interior): the
// input and the output gradient cast to bf16 once for all experts, the up projections writing the
// hidden rows in bf16, the activation and its gradient in bf16, the down projections reading them;
// each holds what the fp32 path casts or rounds to bf16, so the products are the same. Per expert
// and projection only the GEMMs are issued, and each projection's experts' GEMMs of a pass go to
// the device in one call (GemmGroup: a GPU's grouped product). Under the FP8 and MX recipes on a
// GPU (bf16_hidden, as Mlp::bf16_hidden) the up projections leave the hidden rows in bf16 and the
// down projections' dgrads the activation's gradient, which the activation's kernels read as they
// are, leaving the activation and the hidden gradient in fp32 for the recipe's casts: the values
// the fp32 path rounds to bf16 anyway, without its widening passes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/model/activation.h"
#include "loom/model/buffers.h"
#include "loom/model/linear_precision.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

// out [n, out_features] = in W^T of `store`'s weight `id`, through `precision` (null: the fp32
// kernel), and its backward: d_in and the weight's gradient added into. The routed experts'
// projections and a latent MoE layer's latent projections.
void stored_linear_forward(ParameterStore& store, LinearPrecision* precision, int id, float* out, const float* in,
                           int64_t n, int64_t in_features, int64_t out_features);
void stored_linear_backward(ParameterStore& store, LinearPrecision* precision, int id, float* d_in,
                            const float* d_out, const float* in, int64_t n, int64_t in_features,
                            int64_t out_features);

// The padded copies of a grouped GEMM's rows (ExpertMlp's header comment), shared by a model's
// MoE layers (MoeScratch): the input, and the output (backward: the output gradient), the input
// gradient; and the gathers between the two layouts, one launch each: padded row r from row
// pad[r] (-1: a zero row), row r back from padded row unpad[r].
struct ExpertScratch {
  Buffer in, out, d_in;
  Buffer in16, d_out16;  // bf16 interior: the input and the output gradient cast once for all experts
  std::vector<int32_t> pad, unpad;
  StagedTokens pad_on_device, unpad_on_device;
};

class ExpertMlp {
 public:
  struct Saved {
    // in the padded row layout where rows are padded; bf16 under bf16_interior (hidden also under
    // bf16_hidden)
    Buffer hidden, act;
  };
  // Registers experts [first, first + count) of width `width` (d_model or the latent size), each
  // tensor whole and placed as `placement` says (MoeLayer decides).
  ExpertMlp(ParameterStore& store, const ShardSpec& placement, const std::string& prefix, int first, int count,
            int width, int ffn_size, config::Activation activation, float init_std, float out_std);
  int count() const { return count_; }
  // The experts' GEMMs in `recipe`. Every one of the layer's `experts` is registered with
  // `context`, in order, this rank's and the others': fp8_delayed's pending amaxes are then reduced
  // position by position over the ranks holding the layer (an expert a rank does not hold adds
  // zeros), so every rank keeps every expert's history and a checkpoint loads into any
  // expert-parallel size.
  void set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix, int experts);
  // out[rows, width] = expert(in) per expert's row range.
  void forward(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows,
               ExpertScratch& scratch) const;
  // d_in (overwritten) and the parameters' gradients from d_out.
  void backward(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                const std::vector<int64_t>& expert_rows, ExpertScratch& scratch) const;
  // Each expert's row count rounded up to the multiple its GEMMs take (the rows themselves where
  // they take any).
  std::vector<int64_t> padded_rows(const std::vector<int64_t>& expert_rows) const;

 private:
  int hidden_width() const { return static_cast<int>(activation_input_width(activation_, ffn_)); }
  // Whether the experts' GEMMs take bf16 tensors (the bf16 recipe on a GPU).
  bool bf16_interior() const;
  // Whether, short of that, they leave their outputs in bf16 (the FP8 and MX recipes on a GPU).
  bool bf16_hidden() const;
  // f(j, at, n) for each local expert j with rows: n of them, from row `at`.
  template <typename F>
  static void for_each_expert(const std::vector<int64_t>& expert_rows, F&& f) {
    int64_t at = 0;
    for (size_t j = 0; j < expert_rows.size(); ++j) {
      if (expert_rows[j] > 0) f(static_cast<int>(j), at, expert_rows[j]);
      at += expert_rows[j];
    }
  }
  // forward / backward over rows already laid out as the GEMMs take them.
  void forward_grouped(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows,
                       ExpertScratch& scratch) const;
  void backward_grouped(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                        const std::vector<int64_t>& expert_rows, ExpertScratch& scratch) const;
  // The same with a bf16 interior (bf16_interior), over `rows` rows in all.
  void forward_bf16(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows, int64_t rows,
                    ExpertScratch& scratch) const;
  void backward_bf16(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                     const std::vector<int64_t>& expert_rows, int64_t rows, ExpertScratch& scratch) const;
  // The padded layout of `expert_rows`: each expert's padded rows, the rows in both layouts, and
  // the gathers between them on the device (scratch.pad / unpad; null where nothing is padded).
  struct Padding {
    std::vector<int64_t> rows;
    int64_t total = 0, unpadded = 0;
    const int32_t* pad = nullptr;
    const int32_t* unpad = nullptr;
  };
  Padding plan_padding(ExpertScratch& scratch, const std::vector<int64_t>& expert_rows) const;
  // x [p.unpadded rows, width] in the padded layout, in `buffer`.
  const float* pad(Buffer& buffer, const float* x, const Padding& p) const;
  // Expert j's precision of `layers` (in_precision_ or down_precision_), null without a recipe.
  static LinearPrecision* precision_of(const std::vector<std::shared_ptr<LinearPrecision>>& layers, int j);
  ParameterStore* store_;
  Device device_;
  int first_, count_, width_, ffn_;
  config::Activation activation_;
  std::vector<int> in_, down_;  // per local expert: [gate; up] (or up) weight id, down weight id
  std::vector<std::shared_ptr<LinearPrecision>> in_precision_, down_precision_;  // per local expert (empty: fp32)
  int64_t row_multiple_ = 1;  // what each expert's row count is padded to
};

}  // namespace loom::model
