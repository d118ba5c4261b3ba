#pragma once
// Megatron's tensor-parallel linear layers (weights stored [out, in] as in Hugging Face).
//
// ColumnParallelLinear: the global weight's rows (output features) are split over the group;
//   y_local = f(x) W_local^T + b_local. It opens a parallel region: its input crosses f.
// RowParallelLinear: the global weight's columns (input features) are split;
//   y = g(x_local W_local^T) + b. It closes the region: its partial products cross g, and the
//   (replicated) bias is added once, after the reduction.
//
// Both read their parameters from the store by id, so a fused projection ([q; k; v] or
// [gate; up], registered back to back) is one layer with one GEMM.
//
// With a precision recipe, each layer computes what one rank computes (linear_precision.h):
// the GEMM whose reduction dimension is split (column: dgrad over the output features; row:
// forward over the input features) is summed over the ranks in fp32 and rounded once;
// fp8_current's per-tensor scales come from the whole tensor's amax (the max over the group of
// the weight's and of the split operand's pieces); block-scaled recipes require the split to fall
// on their block boundaries (an Error at set_precision otherwise).
#include <cstdint>
#include <memory>

#include "loom/model/buffers.h"
#include "loom/model/linear_precision.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"

namespace loom::model {

// Scratch of the f/g operators, shared by the layers of a model (one runs at a time).
struct ParallelScratch {
  Buffer gathered, partial, d_full;
  Buffer product16;  // a product left in bf16 for the norm after it to add (Block::forward)
  Buffer replicated_kv;  // replicated kv heads' gradients summed over their holders (Attention::backward)
  // A Mamba-2 mixer under context parallelism (Mamba2Mixer): this rank's rows of in_proj (the
  // whole sequences' projection gradient in backward), and the whole sequences' gated output (its
  // gradient in backward).
  Buffer mixer_proj, mixer_gated;
};

class ColumnParallelLinear {
 public:
  // weight: [out_local, in] (bias: [out_local], or -1).
  ColumnParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias, int64_t in_features,
                       int64_t out_local);
  // out[rows, out_local] = f(x) W^T + b, x being this rank's [local_rows, in] of rows = batch*seq.
  // tensors.in: x in bf16 instead (gathered in bf16 under sequence parallelism); tensors.out: the
  // output in bf16 instead (out unused); tensors.keep_input_codes: where the input's FP8 codes are
  // kept for the backward; tensors.in_codes: x's FP8 codes, written by its producer (input_codes;
  // x unused) (LinearPrecision's DeviceTensors).
  void forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch,
               const DeviceTensors& tensors = {}) const;
  // d_x[local rows] += f_backward(d_out W), or = when not `accumulate` (d_x need not be zeroed);
  // parameter gradients added into the store. tensors.in: x in bf16 instead; tensors.dout: d_out
  // in bf16 instead, the bias's gradient (which sums the fp32 d_out) then the caller's, added into
  // bias_grad(); tensors.kept_input_codes: the codes the forward kept; tensors.dout_amax: d_out's
  // amax, taken by its producer (output_grad_amax); tensors.dout_codes: d_out's FP8 codes, written by
  // its producer (output_grad_codes; the layer then has no bias); tensors.din: d_x written whole in
  // bf16 instead (gives_bf16_input_grad; d_x may be null then).
  void backward(float* d_x, const float* d_out, const float* x, int64_t rows, ParallelScratch& scratch,
                bool accumulate = true, const DeviceTensors& tensors = {}) const;
  // The GEMMs' precision (null: fp32); whether the layer has a bias.
  const LinearPrecision* precision() const { return precision_.get(); }
  // Whether the backward can leave d_x in bf16 (tensors.din): one rank (no sum over the group
  // first) whose dgrad rounds its output to bf16 anyway (LinearPrecision::gives_bf16_outputs).
  bool gives_bf16_input_grad() const {
    return tp_->single() && precision_ != nullptr && precision_->gives_bf16_outputs();
  }
  // Whether the layer takes its input in bf16 (tensors.in): its GEMMs are bf16 on a GPU.
  bool takes_bf16_input() const { return precision_ != nullptr && precision_->takes_bf16_tensors(); }
  // Room in `buffer` for the input's FP8 codes over `rows` tokens where the layer keeps them
  // (LinearPrecision::keeps_input_codes: DeviceTensors' keep_input_codes), else null; in the
  // backward, the codes the forward kept in `buffer` (kept_input_codes), else null.
  void* keep_input_codes(Buffer& buffer, int64_t rows) const;
  const void* kept_input_codes(const Buffer& buffer) const;
  bool has_bias() const { return bias_ >= 0; }
  // Under per-tensor FP8 on a GPU, where the kernel producing d_out takes its amax, to hand back as
  // tensors.dout_amax (LinearPrecision::produced_amax; null otherwise): ask just before that kernel.
  float* output_grad_amax() const {
    return precision_ != nullptr ? precision_->produced_amax(Operand::OutputGrad) : nullptr;
  }
  // Whether a kernel producing d_out that could take its amax should (fp8_current on a GPU:
  // LinearPrecision::amax_taken_by_producer); fp8_delayed's cast takes it as it reads d_out.
  bool takes_output_grad_amax() const { return precision_ != nullptr && precision_->amax_taken_by_producer(); }
  // Then, where that kernel writes d_out's FP8 codes itself (LinearPrecision::produced_codes over
  // this rank's [rows, out_local]), to hand back as tensors.dout_codes (codes).
  LinearPrecision::ProducedCodes output_grad_codes(int64_t rows) const {
    return precision_->produced_codes(Operand::OutputGrad, rows, out_);
  }
  // Whether the kernel producing x may write its FP8 codes itself (input_codes): per-tensor FP8 on
  // a GPU without sequence parallelism (which gathers x's rows first; kept codes cannot be gathered).
  bool takes_input_codes() const {
    return precision_ != nullptr && precision_->keeps_input_codes() && !tp_->sequence_parallel();
  }
  // Then where that kernel takes x's amax first (fp8_current; null where the codes' pass takes it,
  // fp8_delayed), to hand back with the codes: ask just before that kernel. And where it writes
  // x's codes (LinearPrecision::produced_codes over [rows, in], the transposed ones into `buffer`,
  // kept to the backward as keep_input_codes'), to hand back as tensors.in_codes (codes).
  float* input_amax() const {
    return precision_->amax_taken_by_cast() ? nullptr : precision_->produced_amax(Operand::Input);
  }
  LinearPrecision::ProducedCodes input_codes(Buffer& buffer, int64_t rows) const {
    return precision_->produced_codes(Operand::Input, rows, in_, keep_input_codes(buffer, rows));
  }
  // The bias's gradient in the store (null without a bias).
  float* bias_grad() const { return bias_ >= 0 ? store_->grad(bias_) : nullptr; }
  int64_t out_local() const { return out_; }
  // The GEMMs' precision recipe (linear_precision.h); null (the default) = fp32 kernels. Throws
  // an Error naming the projection when the recipe's blocks would straddle the split.
  void set_precision(std::shared_ptr<LinearPrecision> precision);

 private:
  ParameterStore* store_;
  const TensorParallel* tp_;
  int weight_, bias_;
  int64_t in_, out_;
  std::shared_ptr<LinearPrecision> precision_;
};

class RowParallelLinear {
 public:
  // weight: [out, in_local] (bias: [out], replicated, or -1).
  RowParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias, int64_t in_local,
                    int64_t out_features);
  // out[local rows, out] += g(x W^T) + b, x being [rows, in_local] inside the region. tensors.in: x
  // in bf16 instead; tensors.keep_input_codes: where x's FP8 codes are kept for the backward;
  // tensors.in_amax: x's amax, taken by its producer (input_amax); tensors.in_codes: x's FP8 codes,
  // written by its producer (input_codes). `residual_in` (out's shape; null: out): out = residual_in
  // + g(x W^T) + b instead, a residual stream's next tensor from its input: the product's own
  // add reads it where it can (a precision recipe, one tensor-parallel rank), else it is copied
  // into out first. The same values either way. tensors.out (where gives_bf16_output()): the
  // product, rounded after its bias, left in bf16 there instead of added into out (a norm after
  // it adds it: Norm::forward_added).
  void forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch,
               const DeviceTensors& tensors = {}, const float* residual_in = nullptr) const;
  // Whether the forward can leave its product in bf16 (tensors.out): one rank (no sum over the
  // group first) whose GEMMs round their outputs to bf16 (LinearPrecision::gives_bf16_outputs).
  bool gives_bf16_output() const {
    return tp_->single() && precision_ != nullptr && precision_->gives_bf16_outputs();
  }
  // d_x[rows, in_local] += g_backward(d_out) W, d_out being this rank's [local_rows, out]; = when
  // not `accumulate`. tensors.in: x in bf16 instead; tensors.din: d_x written whole in bf16
  // instead; tensors.kept_input_codes: the codes the forward kept; tensors.dout (where
  // takes_bf16_output_grad()): d_out's values rounded to bf16, which both GEMMs multiply instead of
  // casting d_out (the bias's gradient still sums d_out); tensors.dout_amax (where
  // takes_output_grad_amax()): d_out's amax, taken by its producer.
  void backward(float* d_x, const float* d_out, const float* x, int64_t rows, ParallelScratch& scratch,
                bool accumulate = true, const DeviceTensors& tensors = {}) const;
  // Whether the backward takes its output gradient in bf16 as well (tensors.dout): one rank (no
  // gather first) whose GEMMs are bf16 (LinearPrecision::takes_bf16_tensors).
  bool takes_bf16_output_grad() const {
    return tp_->single() && precision_ != nullptr && precision_->takes_bf16_tensors();
  }
  // As ColumnParallelLinear's.
  const LinearPrecision* precision() const { return precision_.get(); }
  // Whether the kernel producing d_out should take its amax for the backward's cast (fp8_current on
  // a GPU: LinearPrecision::amax_taken_by_producer) and can: not under sequence parallelism, whose
  // backward gathers d_out's rows first (their producer sees this rank's alone). Then
  // output_grad_amax(), asked just before that kernel, is where, handed back as tensors.dout_amax.
  bool takes_output_grad_amax() const {
    return precision_ != nullptr && precision_->amax_taken_by_producer() && !tp_->sequence_parallel();
  }
  float* output_grad_amax() const { return precision_->produced_amax(Operand::OutputGrad); }
  // Whether the layer accepts a bf16-valued input in bf16 (tensors.in; LinearPrecision::accepts_bf16_input).
  bool accepts_bf16_input() const { return precision_ != nullptr && precision_->accepts_bf16_input(); }
  void* keep_input_codes(Buffer& buffer, int64_t rows) const;
  const void* kept_input_codes(const Buffer& buffer) const;
  // Under per-tensor FP8 on a GPU, where the kernel producing x takes its amax, to hand back as
  // tensors.in_amax (LinearPrecision::produced_amax; null otherwise): ask just before that kernel.
  float* input_amax() const { return precision_ != nullptr ? precision_->produced_amax(Operand::Input) : nullptr; }
  // Then, where that kernel writes x's FP8 codes itself (LinearPrecision::produced_codes over
  // [rows, in_local], the transposed ones into `buffer`, kept to the backward as keep_input_codes'),
  // to hand back as tensors.in_codes (codes).
  LinearPrecision::ProducedCodes input_codes(Buffer& buffer, int64_t rows) const {
    return precision_->produced_codes(Operand::Input, rows, in_, keep_input_codes(buffer, rows));
  }
  // As ColumnParallelLinear::set_precision.
  void set_precision(std::shared_ptr<LinearPrecision> precision);

 private:
  ParameterStore* store_;
  const TensorParallel* tp_;
  int weight_, bias_;
  int64_t in_, out_;
  std::shared_ptr<LinearPrecision> precision_;
};

}  // namespace loom::model
