#include "loom/model/expert_mlp.h"

#include <numeric>

#include "loom/kernels/ops.h"

namespace loom::model {

ExpertMlp::ExpertMlp(ParameterStore& store, const TensorParallel& tp, const std::string& prefix, int first,
                     int count, int width, int ffn_size, config::Activation activation, float init_std,
                     float out_std)
    : store_(&store), device_(store.device()), count_(count), width_(width), ffn_(ffn_size), activation_(activation) {
  const bool swiglu = activation == config::Activation::Swiglu;
  for (int j = 0; j < count; ++j) {
    const std::string name = prefix + ".experts." + std::to_string(first + j);
    // Whole on every tensor-parallel rank (each computes the layer for all its tokens).
    if (swiglu) {
      in_.push_back(store.add(name + ".gate_proj.weight", {ffn_size, width}, Init::Normal, init_std, tp.replicated()));
      store.add(name + ".up_proj.weight", {ffn_size, width}, Init::Normal, init_std, tp.replicated());
    } else {
      in_.push_back(store.add(name + ".up_proj.weight", {ffn_size, width}, Init::Normal, init_std, tp.replicated()));
    }
    down_.push_back(store.add(name + ".down_proj.weight", {width, ffn_size}, Init::Normal, out_std, tp.replicated()));
  }
}

void ExpertMlp::forward(Saved& saved, float* out, const float* in, const std::vector<int64_t>& expert_rows) const {
  const int64_t rows = std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0});
  float* hidden = sized(saved.hidden, rows * hidden_width(), device_);
  float* act = sized(saved.act, rows * ffn_, device_);
  int64_t at = 0;
  for (int j = 0; j < count_; ++j) {
    const int64_t n = expert_rows[j];
    if (n == 0) continue;
    float* h = hidden + at * hidden_width();
    float* a = act + at * ffn_;
    kernels::linear_forward(device_, h, in + at * width_, store_->value(in_[j]), nullptr, n, width_, hidden_width());
    activation_forward(device_, activation_, a, h, n, ffn_);
    kernels::linear_forward(device_, out + at * width_, a, store_->value(down_[j]), nullptr, n, ffn_, width_);
    at += n;
  }
}

void ExpertMlp::backward(float* d_in, const float* d_out, const float* in, const Saved& saved, Workspace& work,
                         const std::vector<int64_t>& expert_rows) const {
  const int64_t rows = std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0});
  float* d_act = zeroed(work.d_act, rows * ffn_, device_);
  float* d_hidden = sized(work.d_hidden, rows * hidden_width(), device_);  // each expert's rows written whole
  if (rows > 0) allocator(device_).zero(d_in, static_cast<size_t>(rows * width_) * sizeof(float));
  int64_t at = 0;
  for (int j = 0; j < count_; ++j) {
    const int64_t n = expert_rows[j];
    if (n == 0) continue;
    float* da = d_act + at * ffn_;
    float* dh = d_hidden + at * hidden_width();
    kernels::linear_backward(device_, da, store_->grad(down_[j]), nullptr, d_out + at * width_,
                             saved.act.data() + at * ffn_, store_->value(down_[j]), n, ffn_, width_);
    activation_backward(device_, activation_, dh, da, saved.hidden.data() + at * hidden_width(), n, ffn_);
    kernels::linear_backward(device_, d_in + at * width_, store_->grad(in_[j]), nullptr, dh, in + at * width_,
                             store_->value(in_[j]), n, width_, hidden_width());
    at += n;
  }
}

}  // namespace loom::model
