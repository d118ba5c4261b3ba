#include "loom/model/mlp.h"

#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/linear.h"

namespace loom::model {

namespace k = loom::kernels::cpu;

Mlp::Mlp(ParameterStore& store, const std::string& prefix, int d_model, int ffn_size, bool swiglu, bool bias,
         float init_std, float out_std)
    : store_(&store), d_model_(d_model), ffn_(ffn_size), swiglu_(swiglu) {
  // Registered back to back so [gate; up] is one [2*ffn, d_model] matrix.
  if (swiglu) {
    in_weight_ = store.add(prefix + ".gate_proj.weight", {ffn_size, d_model}, Init::Normal, init_std);
    store.add(prefix + ".up_proj.weight", {ffn_size, d_model}, Init::Normal, init_std);
    if (bias) {
      in_bias_ = store.add(prefix + ".gate_proj.bias", {ffn_size}, Init::Zeros);
      store.add(prefix + ".up_proj.bias", {ffn_size}, Init::Zeros);
    }
  } else {
    in_weight_ = store.add(prefix + ".up_proj.weight", {ffn_size, d_model}, Init::Normal, init_std);
    if (bias) in_bias_ = store.add(prefix + ".up_proj.bias", {ffn_size}, Init::Zeros);
  }
  down_weight_ = store.add(prefix + ".down_proj.weight", {d_model, ffn_size}, Init::Normal, out_std);
  if (bias) down_bias_ = store.add(prefix + ".down_proj.bias", {d_model}, Init::Zeros);
}

void Mlp::forward(Saved& saved, float* residual, const float* normed, int64_t rows) const {
  const int width = hidden_width();
  float* hidden = sized(saved.hidden, rows * width);
  float* act = sized(saved.act, rows * ffn_);
  k::linear_forward(hidden, normed, store_->value(in_weight_), in_bias_ >= 0 ? store_->value(in_bias_) : nullptr,
                    rows, d_model_, width);
  if (swiglu_) {
    k::swiglu_forward(act, hidden, rows, ffn_);
  } else {
    k::gelu_forward(act, hidden, rows * ffn_);
  }
  k::linear_forward(residual, act, store_->value(down_weight_),
                    down_bias_ >= 0 ? store_->value(down_bias_) : nullptr, rows, ffn_, d_model_, true);
}

void Mlp::backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                   Workspace& work, int64_t rows) const {
  const int width = hidden_width();
  float* d_act = zeroed(work.d_act, rows * ffn_);
  k::linear_backward(d_act, store_->grad(down_weight_), down_bias_ >= 0 ? store_->grad(down_bias_) : nullptr,
                     d_residual, saved.act.data(), store_->value(down_weight_), rows, ffn_, d_model_);
  float* d_hidden = zeroed(work.d_hidden, rows * width);
  if (swiglu_) {
    k::swiglu_backward(d_hidden, d_act, saved.hidden.data(), rows, ffn_);
  } else {
    k::gelu_backward(d_hidden, d_act, saved.hidden.data(), rows * ffn_);
  }
  k::linear_backward(d_normed, store_->grad(in_weight_), in_bias_ >= 0 ? store_->grad(in_bias_) : nullptr,
                     d_hidden, normed, store_->value(in_weight_), rows, d_model_, width);
}

}  // namespace loom::model
