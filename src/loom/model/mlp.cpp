#include "loom/model/mlp.h"

#include "loom/core/error.h"
#include "loom/model/activation.h"

namespace loom::model {

Mlp::Mlp(ParameterStore& store, const TensorParallel& tp, int layer, const std::string& prefix, int d_model,
         int ffn_size, config::Activation activation, bool bias, float init_std, float out_std)
    : device_(store.device()), d_model_(d_model), activation_(activation), swiglu_(activation == config::Activation::Swiglu) {
  LOOM_CHECK(ffn_size % tp.size() == 0, "layer " + std::to_string(layer) + " (" + prefix + "): ffn_size " +
                                        std::to_string(ffn_size) + " cannot be split over " +
                                        std::to_string(tp.size()) + " tensor-parallel ranks (parallel.tp must divide it)");
  ffn_ = ffn_size / tp.size();
  const int64_t start = static_cast<int64_t>(tp.rank()) * ffn_;
  auto rows_spec = [&] { return tp.split({ffn_size, d_model}, 0, start, ffn_); };
  auto bias_spec = [&] { return tp.split({ffn_size}, 0, start, ffn_); };
  // Registered back to back so [gate; up] is one [2*ffn, d_model] matrix.
  int in_weight = -1, in_bias = -1, down_weight = -1, down_bias = -1;
  if (swiglu_) {
    in_weight = store.add(prefix + ".gate_proj.weight", {ffn_, d_model}, Init::Normal, init_std, rows_spec());
    store.add(prefix + ".up_proj.weight", {ffn_, d_model}, Init::Normal, init_std, rows_spec());
    if (bias) {
      in_bias = store.add(prefix + ".gate_proj.bias", {ffn_}, Init::Zeros, 0.0f, bias_spec());
      store.add(prefix + ".up_proj.bias", {ffn_}, Init::Zeros, 0.0f, bias_spec());
    }
  } else {
    in_weight = store.add(prefix + ".up_proj.weight", {ffn_, d_model}, Init::Normal, init_std, rows_spec());
    if (bias) in_bias = store.add(prefix + ".up_proj.bias", {ffn_}, Init::Zeros, 0.0f, bias_spec());
  }
  down_weight = store.add(prefix + ".down_proj.weight", {d_model, ffn_}, Init::Normal, out_std,
                          tp.split({d_model, ffn_size}, 1, start, ffn_));
  if (bias) down_bias = store.add(prefix + ".down_proj.bias", {d_model}, Init::Zeros, 0.0f, tp.replicated());
  in_.emplace(store, tp, in_weight, in_bias, d_model, hidden_width());
  down_.emplace(store, tp, down_weight, down_bias, ffn_, d_model);
}

void Mlp::set_precision(PrecisionContext& context, Recipe recipe, const std::string& prefix) {
  gelu_epilogue_ = context.policy().gelu_epilogue;
  in_->set_precision(context.make(recipe, prefix + ".up_proj"));
  down_->set_precision(context.make(recipe, prefix + ".down_proj"));
}

bool Mlp::bf16_interior() const {
  const LinearPrecision *up = in_->precision(), *down = down_->precision();
  return up != nullptr && down != nullptr && up->takes_bf16_tensors() && down->takes_bf16_tensors();
}

bool Mlp::fuses_gelu() const {
  return gelu_epilogue_ && bf16_interior() && activation_ == config::Activation::Gelu && ffn_ % 8 == 0;
}

bool Mlp::bf16_hidden() const {
  const LinearPrecision *up = in_->precision(), *down = down_->precision();
  return !bf16_interior() && up != nullptr && down != nullptr && up->gives_bf16_outputs() &&
         down->gives_bf16_outputs();
}

bool Mlp::fp8_codes_from_activation() const {
  return bf16_hidden() && in_->precision()->keeps_input_codes() && down_->precision()->keeps_input_codes() &&
         !in_->has_bias();
}

void Mlp::forward(Saved& saved, float* residual, const NormedRows& normed, int64_t rows, ParallelScratch& scratch,
                  const float* residual_in, void* out16) const {
  LOOM_CHECK(out16 == nullptr || gives_bf16_output(),
             "Mlp::forward: a bf16 output is for a down projection rounding to bf16 on one rank");
  if (out16 != nullptr) residual_in = nullptr;  // the product alone, added by its reader
  if (bf16_interior()) {
    void* hidden = sized_16bit(saved.hidden, rows * hidden_width(), device_);
    void* act = sized_16bit(saved.act, rows * ffn_, device_);
    if (fuses_gelu()) {
      in_->forward(nullptr, normed.fp32, rows, scratch,
                   DeviceTensors{.in = normed.bf16, .out = act, .pre_gelu = hidden});
    } else {
      in_->forward(nullptr, normed.fp32, rows, scratch, DeviceTensors{.in = normed.bf16, .out = hidden});
      activation_forward_bf16(device_, activation_, nullptr, act, hidden, rows, ffn_);
    }
    down_->forward(residual, nullptr, rows, scratch, DeviceTensors{.in = act, .out = out16}, residual_in);
    return;
  }
  void* up_codes = in_->keep_input_codes(saved.up_codes, rows);
  // No fp32 activation where the activation's kernels write the down projection's codes themselves.
  float* act = fp8_codes_from_activation() ? nullptr : sized(saved.act, rows * ffn_, device_);
  float* act_amax = nullptr;  // taken by the activation (per-tensor FP8: down's cast needs no amax pass)
  if (bf16_hidden()) {
    void* hidden = sized_16bit(saved.hidden, rows * hidden_width(), device_);
    DeviceTensors tensors = normed.forward_tensors(up_codes);
    tensors.out = hidden;
    in_->forward(nullptr, normed.fp32, rows, scratch, tensors);
    if (fp8_codes_from_activation()) {
      // The activation's codes for the down projection (both orientations): no fp32 activation.
      // fp8_current's scale needs the amax of the same values first, a pass of its own;
      // fp8_delayed's codes pass takes it as it casts.
      if (!down_->precision()->amax_taken_by_cast())
        activation_forward_bf16(device_, activation_, nullptr, nullptr, hidden, rows, ffn_, down_->input_amax());
      const LinearPrecision::ProducedCodes codes = down_->input_codes(saved.down_codes, rows);
      kernels::activation_forward_codes(device_, kernel_activation(activation_), hidden, rows, ffn_, codes.cast,
                                        codes.codes, codes.transposed);
      down_->forward(residual, nullptr, rows, scratch, DeviceTensors{.out = out16, .in_codes = codes.codes},
                     residual_in);
      return;
    }
    act_amax = down_->input_amax();
    activation_forward_bf16(device_, activation_, act, nullptr, hidden, rows, ffn_, act_amax);
  } else {
    float* hidden = sized(saved.hidden, rows * hidden_width(), device_);
    in_->forward(hidden, normed.fp32, rows, scratch, normed.forward_tensors(up_codes));
    activation_forward(device_, activation_, act, hidden, rows, ffn_);
  }
  down_->forward(residual, act, rows, scratch,
                 DeviceTensors{.out = out16,
                               .keep_input_codes = down_->keep_input_codes(saved.down_codes, rows),
                               .in_amax = act_amax},
                 residual_in);
}

void Mlp::backward(float* d_normed, const float* d_residual, const NormedRows& normed, const Saved& saved,
                   Workspace& work, int64_t rows, ParallelScratch& scratch, bool accumulate, void* d_normed16,
                   const void* d_residual16, const float* d_residual_amax) const {
  LOOM_CHECK(d_normed16 == nullptr || !accumulate, "Mlp::backward: a bf16 d_normed is written whole, not added into");
  LOOM_CHECK(d_residual16 == nullptr || takes_bf16_residual_grad(),
             "Mlp::backward: a bf16 residual gradient is for a bf16 interior's down projection");
  LOOM_CHECK(d_residual_amax == nullptr || takes_residual_grad_amax(),
             "Mlp::backward: a residual gradient's amax taken by its producer is for fp8_current's down projection");
  // Each gradient below is written whole by one producer: nothing is zeroed first.
  if (bf16_interior()) {
    void* d_hidden = sized_16bit(work.d_hidden, rows * hidden_width(), device_);
    if (fuses_gelu()) {  // the down projection's dgrad leaves the hidden gradient and the up bias's
      down_->backward(nullptr, d_residual, nullptr, rows, scratch, false,
                      DeviceTensors{.in = saved.act.data(),
                                    .dout = d_residual16,
                                    .din = d_hidden,
                                    .gelu_input = saved.hidden.data(),
                                    .gelu_bias_grad = in_->bias_grad()});
    } else {
      void* d_act = sized_16bit(work.d_act, rows * ffn_, device_);
      down_->backward(nullptr, d_residual, nullptr, rows, scratch, false,
                      DeviceTensors{.in = saved.act.data(), .dout = d_residual16, .din = d_act});
      // A bias's gradient sums the fp32 hidden gradient: the activation's backward adds it from
      // the same pass that leaves the bf16 one.
      activation_backward_bf16(device_, activation_, nullptr, d_hidden, in_->bias_grad(), d_act,
                               saved.hidden.data(), rows, ffn_);
    }
    in_->backward(d_normed, nullptr, normed.fp32, rows, scratch, accumulate,
                  DeviceTensors{.in = normed.bf16, .dout = d_hidden, .din = d_normed16});
    return;
  }
  const void* down_codes = down_->kept_input_codes(saved.down_codes);
  const void* up_codes = in_->kept_input_codes(saved.up_codes);
  float* d_hidden = fp8_codes_from_activation() ? nullptr : sized(work.d_hidden, rows * hidden_width(), device_);
  float* d_hidden_amax = nullptr;  // taken by the activation's backward (as act_amax above)
  if (bf16_hidden()) {
    void* d_act = sized_16bit(work.d_act, rows * ffn_, device_);
    down_->backward(nullptr, d_residual, saved.act.data(), rows, scratch, false,
                    DeviceTensors{.din = d_act, .kept_input_codes = down_codes, .dout_amax = d_residual_amax});
    if (fp8_codes_from_activation()) {
      // The hidden gradient's codes for both of the up projection's GEMMs, after its amax under
      // fp8_current (fp8_delayed's taken by the codes' pass, as forward).
      if (!in_->precision()->amax_taken_by_cast())
        activation_backward_bf16(device_, activation_, nullptr, nullptr, nullptr, d_act, saved.hidden.data(), rows,
                                 ffn_, in_->output_grad_amax());
      const LinearPrecision::ProducedCodes codes = in_->output_grad_codes(rows);
      kernels::activation_backward_codes(device_, kernel_activation(activation_), d_act, saved.hidden.data(), rows,
                                         ffn_, codes.cast, codes.codes, codes.transposed);
      in_->backward(d_normed, nullptr, normed.fp32, rows, scratch, accumulate,
                    DeviceTensors{.in = normed.bf16,
                                  .din = d_normed16,
                                  .kept_input_codes = up_codes,
                                  .dout_codes = codes.codes});
      return;
    }
    d_hidden_amax = in_->output_grad_amax();
    activation_backward_bf16(device_, activation_, d_hidden, nullptr, nullptr, d_act, saved.hidden.data(), rows,
                             ffn_, d_hidden_amax);
  } else {
    float* d_act = sized(work.d_act, rows * ffn_, device_);
    down_->backward(d_act, d_residual, saved.act.data(), rows, scratch, false,
                    DeviceTensors{.kept_input_codes = down_codes, .dout_amax = d_residual_amax});
    activation_backward(device_, activation_, d_hidden, d_act, saved.hidden.data(), rows, ffn_);
  }
  in_->backward(d_normed, d_hidden, normed.fp32, rows, scratch, accumulate,
                DeviceTensors{
                    .in = normed.bf16, .din = d_normed16, .kept_input_codes = up_codes, .dout_amax = d_hidden_amax});
}

}  // namespace loom::model
