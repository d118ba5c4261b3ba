#include "loom/model/attention.h"

#include <algorithm>

#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/linear.h"

namespace loom::model {

namespace k = loom::kernels::cpu;

Attention::Attention(ParameterStore& store, const std::string& prefix, int d_model, int heads, int kv_heads,
                     bool bias, const k::RopeTable* rope, float init_std, float out_std)
    : store_(&store), d_model_(d_model), heads_(heads), kv_heads_(kv_heads), head_dim_(d_model / heads), rope_(rope) {
  // Registered back to back so [q; k; v] is one [(heads + 2 kv_heads) * head_dim, d_model] matrix.
  qkv_weight_ = store.add(prefix + ".q_proj.weight", {heads * head_dim_, d_model}, Init::Normal, init_std);
  store.add(prefix + ".k_proj.weight", {kv_heads * head_dim_, d_model}, Init::Normal, init_std);
  store.add(prefix + ".v_proj.weight", {kv_heads * head_dim_, d_model}, Init::Normal, init_std);
  if (bias) {
    qkv_bias_ = store.add(prefix + ".q_proj.bias", {heads * head_dim_}, Init::Zeros);
    store.add(prefix + ".k_proj.bias", {kv_heads * head_dim_}, Init::Zeros);
    store.add(prefix + ".v_proj.bias", {kv_heads * head_dim_}, Init::Zeros);
  }
  out_weight_ = store.add(prefix + ".o_proj.weight", {d_model, heads * head_dim_}, Init::Normal, out_std);
  if (bias) out_bias_ = store.add(prefix + ".o_proj.bias", {d_model}, Init::Zeros);
}

void Attention::forward(Saved& saved, float* residual, const float* normed, int64_t batch, int64_t seq) const {
  const int64_t rows = batch * seq, W = qkv_width(), att_width = heads_ * head_dim_;
  float* qkv = sized(saved.qkv, rows * W);
  k::linear_forward(qkv, normed, store_->value(qkv_weight_), qkv_bias_ >= 0 ? store_->value(qkv_bias_) : nullptr,
                    rows, d_model_, W);
  if (rope_ != nullptr) k::rope_forward(qkv, rows, W, 0, heads_ + kv_heads_, seq, 0, *rope_);
  float* att = sized(saved.att, rows * att_width);
  float* probs = zeroed(saved.probs, batch * heads_ * seq * seq);
  k::attention_forward(att, probs, qkv, {batch, seq, heads_, kv_heads_, head_dim_});
  k::linear_forward(residual, att, store_->value(out_weight_), out_bias_ >= 0 ? store_->value(out_bias_) : nullptr,
                    rows, att_width, d_model_, true);
}

void Attention::backward(float* d_normed, const float* d_residual, const float* normed, const Saved& saved,
                         Workspace& work, int64_t batch, int64_t seq) const {
  const int64_t rows = batch * seq, W = qkv_width(), att_width = heads_ * head_dim_;
  float* d_att = zeroed(work.d_att, rows * att_width);
  k::linear_backward(d_att, store_->grad(out_weight_), out_bias_ >= 0 ? store_->grad(out_bias_) : nullptr,
                     d_residual, saved.att.data(), store_->value(out_weight_), rows, att_width, d_model_);
  float* d_qkv = zeroed(work.d_qkv, rows * W);
  k::attention_backward(d_qkv, d_att, saved.probs.data(), saved.qkv.data(), {batch, seq, heads_, kv_heads_, head_dim_});
  if (rope_ != nullptr) k::rope_backward(d_qkv, rows, W, 0, heads_ + kv_heads_, seq, 0, *rope_);
  k::linear_backward(d_normed, store_->grad(qkv_weight_), qkv_bias_ >= 0 ? store_->grad(qkv_bias_) : nullptr, d_qkv,
                     normed, store_->value(qkv_weight_), rows, d_model_, W);
}

void Attention::decode(float* residual, const float* normed, int64_t rows, int64_t past, KVCache& cache,
                       Saved& scratch, int64_t max_positions) const {
  const int64_t W = qkv_width(), kv_width = kv_heads_ * head_dim_, att_width = heads_ * head_dim_;
  float* qkv = sized(scratch.qkv, rows * W);
  k::linear_forward(qkv, normed, store_->value(qkv_weight_), qkv_bias_ >= 0 ? store_->value(qkv_bias_) : nullptr,
                    rows, d_model_, W);
  if (rope_ != nullptr) k::rope_forward(qkv, rows, W, 0, heads_ + kv_heads_, rows, past, *rope_);
  float* keys = sized(cache.keys, max_positions * kv_width);
  float* values = sized(cache.values, max_positions * kv_width);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = qkv + r * W;
    std::copy(row + att_width, row + att_width + kv_width, keys + (past + r) * kv_width);
    std::copy(row + att_width + kv_width, row + att_width + 2 * kv_width, values + (past + r) * kv_width);
  }
  float* att = sized(scratch.att, rows * att_width);
  k::attention_decode(att, qkv, W, keys, values, past, rows, heads_, kv_heads_, head_dim_);
  k::linear_forward(residual, att, store_->value(out_weight_), out_bias_ >= 0 ? store_->value(out_bias_) : nullptr,
                    rows, att_width, d_model_, true);
}

}  // namespace loom::model
