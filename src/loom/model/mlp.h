#pragma once
// MLP sub-block: SwiGLU (gate_proj, up_proj, down_proj; gate and up fused into one GEMM), GELU
// (up_proj, down_proj, as GPT-2's c_fc / c_proj) or squared ReLU (up_proj, relu^2, down_proj, as
// Nemotron-H). Tensor parallelism splits the ffn
// features: [gate; up] column-parallel, down row-parallel.
#include <optional>
#include <string>

#include "loom/config/enums.h"
#include "loom/model/buffers.h"
#include "loom/model/norm.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

class Mlp {
 public:
  struct Saved {
    // hidden = [gate | up] rows for SwiGLU, else the pre-activation (bf16_interior and bf16_hidden:
    // 2-byte elements; act too under bf16_interior; no act under fp8_codes_from_activation)
    Buffer hidden, act;
    Buffer up_codes, down_codes;  // the projections' FP8 input codes, where they keep them (DeviceTensors)
  };
  // Throws naming the layer when ffn_size cannot be split over the tensor-parallel group.
  Mlp(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix, int d_model,
      int ffn_size, config::Activation activation, bool bias, float init_std, float out_std);
  // residual[local rows] += down(act(up(normed))), rows = the layer's batch * seq; normed in bf16
  // where takes_bf16_input(), as FP8 codes where takes_input_codes() and the norm wrote them.
  // `residual_in` (null: residual): residual = residual_in + down(...) instead (RowParallelLinear::forward's).
  // `out16` (where gives_bf16_output()): down(...) left there in bf16 (rounded after its bias)
  // instead, residual not written (the next block's first norm adds it: Block's ResidualLink).
  void forward(Saved& saved, float* residual, const NormedRows& normed, int64_t rows, ParallelScratch& scratch,
               const float* residual_in = nullptr, void* out16 = nullptr) const;
  // Whether the forward can leave the down projection's product in bf16 (RowParallelLinear::gives_bf16_output).
  bool gives_bf16_output() const { return down_->gives_bf16_output(); }
  // d_normed += d/d(normed) of the branch, given d_residual (= when not `accumulate`: a block's
  // MLP is d_normed's only source, a shared expert one of several); parameter gradients into the
  // store.
  // `d_normed16` (not accumulating, where gives_bf16_input_grad()): d_normed written whole in bf16
  // there instead (d_normed may be null then). `d_residual16` (where takes_bf16_residual_grad()):
  // d_residual's values in bf16, which the down projection's GEMMs multiply; `d_residual_amax`
  // (where takes_residual_grad_amax()): d_residual's amax, taken by its producer in the slot
  // residual_grad_amax() gave (ResidualGradForReader).
  void backward(float* d_normed, const float* d_residual, const NormedRows& normed, const Saved& saved,
                Workspace& work, int64_t rows, ParallelScratch& scratch, bool accumulate,
                void* d_normed16 = nullptr, const void* d_residual16 = nullptr,
                const float* d_residual_amax = nullptr) const;
  // Whether the backward can leave d_normed in bf16 (the up projection's, ColumnParallelLinear's).
  bool gives_bf16_input_grad() const { return in_->gives_bf16_input_grad(); }
  // Whether it takes d_residual in bf16 too: a bf16 interior whose down projection takes it.
  bool takes_bf16_residual_grad() const { return bf16_interior() && down_->takes_bf16_output_grad(); }
  // Whether the down projection takes d_residual's amax from its producer
  // (RowParallelLinear::takes_output_grad_amax); then where, asked just before that producer.
  bool takes_residual_grad_amax() const { return down_->takes_output_grad_amax(); }
  float* residual_grad_amax() const { return down_->output_grad_amax(); }
  // Precision recipe of the up (gate+up) and down projections' GEMMs.
  // `prefix`: the module's name (model.layers.N.mlp), naming its GEMMs' precision state.
  void set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix);
  // Whether the MLP keeps its interior in bf16: on a GPU under the bf16 recipe (both projections),
  // the hidden pre-activation and the activation (saved for backward) and their gradients are
  // bf16 tensors handed between the GEMMs and the activation kernels as they are
  // (kernels::activation_forward_bf16, LinearPrecision's DeviceTensors): the values the fp32 path
  // rounds or casts to bf16 anyway (the up projection's output is rounded to bf16; the down
  // projection casts the activation and the hidden gradient is cast for both of the up
  // projection's backward GEMMs), so the results are the same, without those casts and widenings
  // and with half the bytes. A bias on the up projection takes its gradient from the fp32 hidden
  // gradient, which the activation's backward sums as it leaves the bf16 one (fuses_gelu: from
  // the bf16 one its down projection's dgrad leaves).
  bool bf16_interior() const;
  // Whether, within that, GELU runs in the projections' epilogues (as llm.c's gelu_fusion): the up
  // projection's product writes the saved pre-activation and its GELU, the down projection's dgrad
  // writes the hidden gradient from the saved pre-activation and sums the up projection's bias
  // gradient from it (kernels::PrecisionGemm::pre_gelu16): no activation pass either way, and
  // neither the activation's input read again nor its gradient written and read. A GELU MLP with
  // a bf16 interior whose ffn features (this rank's) are a multiple of 8, as cuBLASLt's epilogue
  // takes them. On a GPU the epilogue applies GELU (and its derivative) to the fp32 sum before the
  // one rounding where the passes apply them to the rounded bf16 values: the same within bf16's
  // rounding; the emulated device computes the passes' values. precision.gelu_epilogue = false
  // keeps the passes (to measure one against the other).
  bool fuses_gelu() const;
  // Whether, short of that, the MLP keeps the bf16 outputs of its GEMMs bf16: on a GPU under the
  // FP8 and MX recipes, whose GEMMs round their outputs to bf16 too, the hidden pre-activation
  // (the up projection's output, saved for backward) and the activation's gradient (the down
  // projection's dgrad output) are bf16 tensors, read by the activation kernels over bf16 inputs
  // (kernels::activation_forward_bf16 / _backward_bf16), which leave the activation and the hidden
  // gradient in fp32 for the recipe's own casts: the same values without the two widening passes,
  // with half their bytes.
  bool bf16_hidden() const;
  // Whether, within that, the activation's kernels write the projections' FP8 codes themselves:
  // under per-tensor FP8 (fp8_delayed, fp8_current) on a GPU without an up-projection bias (whose
  // gradient sums the fp32 hidden gradient), the down projection's input codes and the up
  // projection's output-gradient codes, both orientations, are cast from what the activation reads
  // (kernels::activation_forward_codes / _backward_codes) after an amax pass over the same values:
  // the codes the fp32 activation and hidden gradient would be cast to, with neither tensor
  // written or read (4 and 10 bytes fewer per activation element) nor the activation kept.
  bool fp8_codes_from_activation() const;
  // Whether training may hand the normed input over in bf16: the up projection's GEMMs are bf16
  // on a GPU, so it casts the input to bf16 anyway (for the forward and the weight gradient).
  bool takes_bf16_input() const { return in_->takes_bf16_input(); }
  // As Attention's: the norm before it may write the up projection's input as FP8 codes itself.
  bool takes_input_codes() const { return in_->takes_input_codes(); }
  float* input_amax() const { return in_->input_amax(); }
  LinearPrecision::ProducedCodes input_codes(Saved& saved, int64_t rows) const {
    return in_->input_codes(saved.up_codes, rows);
  }

 private:
  int hidden_width() const { return swiglu_ ? 2 * ffn_ : ffn_; }
  Device device_;
  int d_model_, ffn_;  // ffn_: this rank's features
  config::Activation activation_;
  bool swiglu_;
  bool gelu_epilogue_ = true;  // precision.gelu_epilogue
  std::optional<ColumnParallelLinear> in_;
  std::optional<RowParallelLinear> down_;
};

}  // namespace loom::model
