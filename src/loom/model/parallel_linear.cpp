#include "loom/model/parallel_linear.h"

#include <functional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::model {

namespace {
constexpr const char* kFp32Layer =
    "bf16 tensors or FP8 input codes need a bf16 or FP8 linear layer on a GPU (this one runs in fp32)";

// The fp32 kernels, or the layer's precision recipe when it has one.
void linear_forward(Device device, LinearPrecision* precision, float* out, const float* in, const float* weight,
                    const float* bias, int64_t n, int64_t in_features, int64_t out_features, bool accumulate = false,
                    GemmOutput output = GemmOutput::Rounded, const DeviceTensors& tensors = {}) {
  if (precision != nullptr) {
    precision->forward(out, in, weight, bias, n, in_features, out_features, accumulate, output, tensors);
  } else {
    LOOM_CHECK(!tensors.any(), kFp32Layer);
    kernels::linear_forward(device, out, in, weight, bias, n, in_features, out_features, accumulate);
  }
}
// `after_dgrad` (when given) runs once, between the two GEMMs (LinearPrecision::backward's contract).
void linear_backward(Device device, LinearPrecision* precision, float* din, float* dweight, float* dbias,
                     const float* dout, const float* in, const float* weight, int64_t n, int64_t in_features,
                     int64_t out_features, GemmOutput din_output, bool accumulate_din, bool accumulate_dweight,
                     const DeviceTensors& tensors = {}, const std::function<void()>& after_dgrad = {}) {
  if (precision != nullptr) {
    precision->backward(din, dweight, dbias, dout, in, weight, n, in_features, out_features, din_output,
                        accumulate_din, tensors, accumulate_dweight, after_dgrad);
    return;
  }
  LOOM_CHECK(!tensors.any(), kFp32Layer);
  kernels::linear_backward(device, din, nullptr, dbias, dout, nullptr, weight, n, in_features, out_features,
                           accumulate_din);
  if (after_dgrad) after_dgrad();
  kernels::linear_backward(device, nullptr, dweight, nullptr, dout, in, nullptr, n, in_features, out_features, false,
                           accumulate_dweight);
}

// A layer's weight gradient (numel elements from `weight`, a fused projection's parameters
// together) is its wgrad GEMM's alone: zero_grads() leaves it stale, and the layer's first backward
// since writes it whole (ParameterStore::take_written_whole) instead of adding into it.
void mark_weight_grad(ParameterStore& store, int weight, int64_t numel) {
  if (numel > 0) store.mark_written_whole(store.list().at(weight).offset, numel);
}
// Whether this backward (over `rows` tokens) writes the weight's gradient whole rather than adds.
bool writes_weight_grad(ParameterStore& store, int weight, int64_t numel, int64_t rows) {
  return rows > 0 && numel > 0 && store.take_written_whole(store.list()[weight].offset, numel);
}

// Room in `buffer` for the FP8 codes of an input [rows, in_features] where `precision` keeps them;
// in the backward, the codes the forward kept there.
void* codes_room(const LinearPrecision* precision, Buffer& buffer, int64_t rows, int64_t in_features, Device device) {
  const int64_t bytes = precision != nullptr ? precision->kept_input_bytes(rows, in_features) : 0;
  return bytes > 0 ? sized_bytes(buffer, bytes, device) : nullptr;
}
const void* kept_codes(const LinearPrecision* precision, const Buffer& buffer) {
  return precision != nullptr && precision->keeps_input_codes() ? buffer.data() : nullptr;
}

// A GEMM reducing over a dimension split across the ranks leaves partial products to be summed.
GemmOutput split_output(const TensorParallel& tp) { return tp.single() ? GemmOutput::Rounded : GemmOutput::Partial; }

// The weights of a (possibly fused) projection: the parameters registered back to back from
// `first` whose rows add up to `rows` ([q; k; v], [gate; up], or one weight).
std::vector<const Parameter*> projection_weights(const ParameterStore& store, int first, int64_t rows) {
  std::vector<const Parameter*> weights;
  int64_t covered = 0;
  for (size_t id = static_cast<size_t>(first); covered < rows && id < store.list().size(); ++id) {
    weights.push_back(&store.list()[id]);
    covered += store.list()[id].shape.at(0);
  }
  LOOM_CHECK(covered == rows, "parallel linear: the weights from " + store.list().at(first).name + " do not add up to " +
                             std::to_string(rows) + " rows");
  return weights;
}

// Block-scaled recipes give each run of `block` elements along a GEMM dimension its own scale.
// Along the split dimension (`dim` of `weight`: its output features for a column-parallel layer,
// its input features for a row-parallel one) a rank's piece holds whole blocks of the global
// tensor, so quantizes exactly as one rank does, iff its length (hence also its offset, the
// pieces being equal) is a multiple of the block; otherwise blocks would straddle the split.
void check_blocks_whole(const LinearPrecision& precision, const TensorParallel& tp, const Parameter& weight, int dim) {
  const int64_t block = scaling_block(precision.recipe());
  const int64_t local = weight.shape.at(dim), global = weight.global_shape().at(dim);
  if (block == 0 || tp.single() || local % block == 0) return;
  std::string layer = weight.name;
  if (layer.size() > 7 && layer.ends_with(".weight")) layer.resize(layer.size() - 7);
  const std::string features = dim == 0 ? "output features" : "input features";
  throw Error(layer + ": precision.recipe=" + recipe_name(precision.recipe()) + " scales blocks of " +
              std::to_string(block) + " along the " + features + ", but parallel.tp=" + std::to_string(tp.size()) +
              " gives each rank " + std::to_string(local) + " of its " + std::to_string(global) + " " + features +
              ", not a multiple of " + std::to_string(block) +
              ": blocks would straddle the split and quantize differently from one rank. Valid: sizes whose "
              "per-rank share is a multiple of " + std::to_string(block) +
              ", or a per-tensor recipe (fp8_current, fp8_delayed, bf16)");
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias,
                                           int64_t in_features, int64_t out_local)
    : store_(&store), tp_(&tp), weight_(weight), bias_(bias), in_(in_features), out_(out_local) {
  mark_weight_grad(store, weight, out_ * in_);
}

void ColumnParallelLinear::set_precision(std::shared_ptr<LinearPrecision> precision) {
  if (precision != nullptr && !tp_->single()) {
    for (const Parameter* w : projection_weights(*store_, weight_, out_)) check_blocks_whole(*precision, *tp_, *w, 0);
    // The input is the whole (gathered) activation on every rank; the weight and the output
    // gradient are this rank's output features.
    precision->set_sharded_operands(tp_->group(), {false, true, true});
  }
  precision_ = std::move(precision);
}

void* ColumnParallelLinear::keep_input_codes(Buffer& buffer, int64_t rows) const {
  return codes_room(precision_.get(), buffer, rows, in_, store_->device());
}
const void* ColumnParallelLinear::kept_input_codes(const Buffer& buffer) const {
  return kept_codes(precision_.get(), buffer);
}

void ColumnParallelLinear::forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch,
                                   const DeviceTensors& tensors) const {
  LOOM_CHECK(tensors.in_codes == nullptr || takes_input_codes(),
             "a column-parallel layer takes its input's FP8 codes from their producer only where takes_input_codes() "
             "(per-tensor FP8 on a GPU, no sequence parallelism)");
  DeviceTensors gathered = tensors;
  const float* full = nullptr;
  if (tensors.in_codes != nullptr) {
    // Written by x's producer, the weight gradient's transposed codes too: nothing to gather.
  } else if (tensors.in != nullptr) {
    gathered.in = tp_->enter_forward_bf16(tensors.in, rows, in_, scratch.gathered);
  } else {
    full = tp_->enter_forward(x, rows, in_, scratch.gathered);
  }
  linear_forward(store_->device(), precision_.get(), out, full, store_->value(weight_),
                 bias_ >= 0 ? store_->value(bias_) : nullptr, rows, in_, out_, false, GemmOutput::Rounded, gathered);
}

void ColumnParallelLinear::backward(float* d_x, const float* d_out, const float* x, int64_t rows,
                                    ParallelScratch& scratch, bool accumulate, const DeviceTensors& tensors) const {
  LOOM_CHECK(tensors.din == nullptr || gives_bf16_input_grad(),
             "a column-parallel layer leaves its input gradient in bf16 only where gives_bf16_input_grad() (one "
             "tensor-parallel rank, a bf16-rounding recipe on a GPU)");
  // Sequence parallel: the full input is gathered again rather than kept from forward, for wgrad
  // alone; unless wgrad multiplies the input's codes the forward kept, and so never reads it.
  // The gather runs beside dgrad, and the sum of the input gradient beside wgrad
  // (TensorParallel::overlaps_communication), else each is waited for where it starts.
  const bool gather = !(tp_->sequence_parallel() && tensors.kept_input_codes != nullptr);
  const bool overlap = tp_->overlaps_communication(), bf16_input = gather && tensors.in != nullptr;
  TensorParallel::PendingRows gathering;
  if (bf16_input) {
    gathering = tp_->start_enter_forward(tensors.in, DType::BF16, rows, in_, scratch.gathered);
  } else if (gather) {
    gathering = tp_->start_enter_forward(x, DType::F32, rows, in_, scratch.gathered);
  }
  if (!overlap) gathering.wait();
  // Across ranks the GEMM writes the whole partial product; the sum then goes into d_x.
  float* d_full = tp_->enter_backward_target(d_x, rows, in_, scratch.d_full, false);
  TensorParallel::PendingSum summing;
  auto after_dgrad = [&] {
    summing = tp_->start_enter_backward(d_full, rows, in_);
    if (!overlap) tp_->finish_enter_backward(summing, d_x, rows, in_, precision_.get(), accumulate);
    gathering.wait();  // wgrad reads the rows next
  };
  // dgrad reduces over the split output features: partial products, rounded after the sum.
  // A bf16 d_out: the bias gradient is the caller's; FP8 codes: the layer has no bias (Mlp).
  float* dbias = tensors.dout == nullptr && tensors.dout_codes == nullptr ? bias_grad() : nullptr;
  const void* full = gathering.result();  // null when not gathered
  linear_backward(store_->device(), precision_.get(), d_full, store_->grad(weight_), dbias, d_out,
                  bf16_input ? nullptr : static_cast<const float*>(full), store_->value(weight_), rows, in_, out_,
                  split_output(*tp_), accumulate && tp_->single(),
                  !writes_weight_grad(*store_, weight_, out_ * in_, rows),
                  DeviceTensors{.in = bf16_input ? full : nullptr,
                                .dout = tensors.dout,
                                .din = tensors.din,
                                .kept_input_codes = tensors.kept_input_codes,
                                .dout_amax = tensors.dout_amax,
                                .dout_codes = tensors.dout_codes},
                  after_dgrad);
  if (overlap) tp_->finish_enter_backward(summing, d_x, rows, in_, precision_.get(), accumulate);
}

RowParallelLinear::RowParallelLinear(ParameterStore& store, const TensorParallel& tp, int weight, int bias,
                                     int64_t in_local, int64_t out_features)
    : store_(&store), tp_(&tp), weight_(weight), bias_(bias), in_(in_local), out_(out_features) {
  mark_weight_grad(store, weight, out_ * in_);
}

void RowParallelLinear::set_precision(std::shared_ptr<LinearPrecision> precision) {
  if (precision != nullptr && !tp_->single()) {
    check_blocks_whole(*precision, *tp_, store_->list().at(weight_), 1);
    // The input and the weight are this rank's input features; the output gradient is whole.
    precision->set_sharded_operands(tp_->group(), {true, true, false});
  }
  precision_ = std::move(precision);
}

void* RowParallelLinear::keep_input_codes(Buffer& buffer, int64_t rows) const {
  return codes_room(precision_.get(), buffer, rows, in_, store_->device());
}
const void* RowParallelLinear::kept_input_codes(const Buffer& buffer) const {
  return kept_codes(precision_.get(), buffer);
}

void RowParallelLinear::forward(float* out, const float* x, int64_t rows, ParallelScratch& scratch,
                                const DeviceTensors& tensors, const float* residual_in) const {
  const float* bias = bias_ >= 0 ? store_->value(bias_) : nullptr;
  const DeviceTensors input{.in = tensors.in,
                            .keep_input_codes = tensors.keep_input_codes,
                            .in_amax = tensors.in_amax,
                            .in_codes = tensors.in_codes};
  if (tensors.out != nullptr) {  // the rounded product (and bias) in bf16, added by its reader
    LOOM_CHECK(gives_bf16_output() && residual_in == nullptr,
               "RowParallelLinear::forward: a bf16 output is for one rank's GEMMs rounding to bf16, not added");
    DeviceTensors bf16_out = input;
    bf16_out.out = tensors.out;
    precision_->forward(nullptr, x, store_->value(weight_), bias, rows, in_, out_, false, GemmOutput::Rounded,
                        bf16_out);
    return;
  }
  if (residual_in == out) residual_in = nullptr;
  if (tp_->single() && precision_ != nullptr) {  // the product adds into the residual stream, reading residual_in
    precision_->forward(out, x, store_->value(weight_), bias, rows, in_, out_, true, GemmOutput::Rounded, input,
                        residual_in);
    return;
  }
  if (residual_in != nullptr) copy_on_device(store_->device(), out, residual_in, tp_->local_rows(rows) * out_);
  if (tp_->single()) {  // no reduction: accumulate straight into the residual stream
    linear_forward(store_->device(), nullptr, out, x, store_->value(weight_), bias, rows, in_, out_, true,
                   GemmOutput::Rounded, input);
    return;
  }
  // The forward GEMM reduces over the split input features: partial products, rounded after g.
  float* partial = tp_->exit_forward_target(out, rows, out_, scratch.partial);
  linear_forward(store_->device(), precision_.get(), partial, x, store_->value(weight_), nullptr, rows, in_, out_, true,
                 GemmOutput::Partial, input);
  tp_->exit_forward(out, partial, bias, rows, out_, precision_.get());
}

void RowParallelLinear::backward(float* d_x, const float* d_out, const float* x, int64_t rows,
                                 ParallelScratch& scratch, bool accumulate, const DeviceTensors& tensors) const {
  LOOM_CHECK(tensors.dout == nullptr || takes_bf16_output_grad(),
             "RowParallelLinear::backward: a bf16 output gradient is for one rank's bf16 GEMMs");
  LOOM_CHECK(tensors.dout_amax == nullptr || takes_output_grad_amax(),
             "RowParallelLinear::backward: an output gradient's amax taken by its producer is for fp8_current on a "
             "GPU without sequence parallelism");
  const float* d_full = tp_->exit_backward(d_out, rows, out_, scratch.gathered);
  linear_backward(store_->device(), precision_.get(), d_x, store_->grad(weight_), nullptr, d_full, x,
                  store_->value(weight_), rows, in_, out_, GemmOutput::Rounded, accumulate,
                  !writes_weight_grad(*store_, weight_, out_ * in_, rows),
                  DeviceTensors{.in = tensors.in,
                                .dout = tensors.dout,
                                .din = tensors.din,
                                .kept_input_codes = tensors.kept_input_codes,
                                .dout_amax = tensors.dout_amax,
                                .gelu_input = tensors.gelu_input,
                                .gelu_bias_grad = tensors.gelu_bias_grad});
  // The bias was added after g, to this rank's rows: its gradient is over those rows (a partial
  // sum under sequence parallelism, completed by the model's gradient sync).
  if (bias_ >= 0) {
    kernels::linear_backward(store_->device(), nullptr, nullptr, store_->grad(bias_), d_out, nullptr, nullptr,
                             tp_->local_rows(rows), 0, out_);
  }
}

}  // namespace loom::model
