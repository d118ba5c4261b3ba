#include "loom/model/transformer.h"

#include <algorithm>
#include <numeric>

#include "loom/core/error.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/linear.h"

namespace loom::model {

namespace k = loom::kernels::cpu;

Transformer::Transformer(const runtime::ModelConfig& config) : config_(config), specs_(resolve_layers(config)) {
  check(config.vocab_size > 0, "model.vocab_size must be resolved before building the model");
  const float std = static_cast<float>(config.init_std);
  unit_params_.resize(config.layers + 2);
  auto registered_since = [&](int unit, int first) {
    for (int id = first; id < static_cast<int>(params_.list().size()); ++id) unit_params_[unit].push_back(id);
  };
  embed_ = params_.add("model.embed_tokens.weight", {config.vocab_size, config.d_model}, Init::Normal, std);
  if (config.positions == "learned") {
    positions_ = params_.add("model.embed_positions.weight", {config.max_seq_len, config.d_model}, Init::Normal, std);
  } else {
    rope_ = std::make_unique<k::RopeTable>(config.max_seq_len, head_dim(config), config.rope_theta);
  }
  registered_since(0, 0);
  blocks_.reserve(config.layers);
  for (int l = 0; l < config.layers; ++l) {
    const int first = static_cast<int>(params_.list().size());
    blocks_.emplace_back(params_, l, config, specs_[l], rope_.get());
    registered_since(l + 1, first);
  }
  const int head_first = static_cast<int>(params_.list().size());
  final_norm_.emplace(params_, "model.norm", config.d_model, config.norm == "layer",
                      static_cast<float>(config.norm_eps));
  head_ = config.tied_embeddings
              ? embed_
              : params_.add("lm_head.weight", {config.vocab_size, config.d_model}, Init::Normal, std);
  registered_since(config.layers + 1, head_first);
  if (config.tied_embeddings) unit_params_[config.layers + 1].push_back(embed_);
  params_.allocate();
  residual_.resize(config.layers + 1);
  saved_.resize(config.recompute ? 0 : config.layers);
}

void Transformer::embed(float* out, const int32_t* tokens, int64_t batch, int64_t seq, int64_t position_start) {
  const int64_t rows = batch * seq;
  for (int64_t r = 0; r < rows; ++r) {
    check(tokens[r] >= 0 && tokens[r] < config_.vocab_size,
          "token id " + std::to_string(tokens[r]) + " is outside the model's vocabulary [0, " +
              std::to_string(config_.vocab_size) + ")");
  }
  k::embedding_forward(out, tokens, params_.value(embed_), rows, config_.d_model, false);
  if (positions_ >= 0) {
    check(position_start + seq <= config_.max_seq_len,
          "sequence of " + std::to_string(position_start + seq) + " positions exceeds model.max_seq_len " +
              std::to_string(config_.max_seq_len));
    position_ids_.resize(rows);
    for (int64_t r = 0; r < rows; ++r) position_ids_[r] = static_cast<int32_t>(position_start + r % seq);
    k::embedding_forward(out, position_ids_.data(), params_.value(positions_), rows, config_.d_model, true);
  }
}

double Transformer::forward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                            float grad_scale) {
  check(seq <= config_.max_seq_len, "sequence length " + std::to_string(seq) + " exceeds model.max_seq_len " +
                                        std::to_string(config_.max_seq_len));
  const int64_t rows = batch * seq, C = config_.d_model, V = config_.vocab_size;
  const int head_unit = config_.layers + 1;
  if (hooks_) hooks_->before_forward(0);
  embed(sized(residual_[0], rows * C), inputs, batch, seq, 0);
  if (hooks_) hooks_->after_forward(0);
  for (int l = 0; l < config_.layers; ++l) {
    if (hooks_) hooks_->before_forward(l + 1);
    blocks_[l].forward(saved_for(l), residual_[l].data(), sized(residual_[l + 1], rows * C), batch, seq);
    if (hooks_) hooks_->after_forward(l + 1);
  }
  if (hooks_) hooks_->before_forward(head_unit);
  final_norm_->forward(final_saved_, residual_[config_.layers].data(), rows);
  float* logits = sized(logits_, rows * V);
  k::linear_forward(logits, final_saved_.out.data(), params_.value(head_), nullptr, rows, C, V);
  const double loss_sum = k::softmax_cross_entropy(logits, sized(losses_, rows), targets, rows, V, grad_scale);
  if (hooks_) hooks_->after_forward(head_unit);
  return loss_sum;
}

double Transformer::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq) {
  return forward(inputs, targets, batch, seq, 0.0f);
}

double Transformer::forward_backward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                                     float grad_scale) {
  check(grad_scale != 0.0f, "forward_backward: grad_scale must be non-zero");
  const double loss_sum = forward(inputs, targets, batch, seq, grad_scale);
  const int64_t rows = batch * seq, C = config_.d_model, V = config_.vocab_size;
  // logits_ now holds d(loss)/d(logits).
  const int head_unit = config_.layers + 1;
  if (hooks_) hooks_->before_backward(head_unit);
  float* d_final = zeroed(d_final_, rows * C);
  k::linear_backward(d_final, params_.grad(head_), nullptr, logits_.data(), final_saved_.out.data(),
                     params_.value(head_), rows, C, V);
  float* d_x = zeroed(d_residual_, rows * C);
  final_norm_->backward(d_x, d_final, residual_[config_.layers].data(), final_saved_, rows);
  if (hooks_) hooks_->after_backward(head_unit);
  for (int l = config_.layers - 1; l >= 0; --l) {
    if (hooks_) hooks_->before_backward(l + 1);
    if (config_.recompute) {
      blocks_[l].forward(shared_saved_, residual_[l].data(), sized(recompute_out_, rows * C), batch, seq);
    }
    blocks_[l].backward(d_x, residual_[l].data(), saved_for(l), work_, batch, seq);
    if (hooks_) hooks_->after_backward(l + 1);
  }
  if (hooks_) hooks_->before_backward(0);
  k::embedding_backward(params_.grad(embed_), d_x, inputs, rows, C);
  if (positions_ >= 0) k::embedding_backward(params_.grad(positions_), d_x, position_ids_.data(), rows, C);
  if (hooks_) hooks_->after_backward(0);
  return loss_sum;
}

const float* Transformer::decode(DecodeState& state, const int32_t* tokens, int64_t count) {
  const int64_t C = config_.d_model, V = config_.vocab_size, max_positions = config_.max_seq_len;
  check(state.length + count <= max_positions,
        "generation reached model.max_seq_len " + std::to_string(max_positions) + " positions");
  if (state.caches.size() != blocks_.size()) state.caches.resize(blocks_.size());
  float* x = sized(state.x, count * C);
  embed(x, tokens, 1, count, state.length);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].decode(x, count, state.length, state.caches[l], state.scratch, max_positions);
  }
  state.length += count;
  final_norm_->forward(state.final_norm, x + (count - 1) * C, 1);
  float* logits = sized(state.logits, V);
  k::linear_forward(logits, state.final_norm.out.data(), params_.value(head_), nullptr, 1, C, V);
  return logits;
}

std::vector<int> Transformer::gradient_ready_unit() const {
  std::vector<int> ready(params_.list().size(), -1);
  // Backward runs units from last to first, so a gradient is complete after the lowest unit using it.
  for (int unit = units() - 1; unit >= 0; --unit) {
    for (int id : unit_params_[unit]) ready[id] = unit;
  }
  return ready;
}

double Transformer::training_flops_per_token(int64_t seq) const {
  const double C = config_.d_model, hd = head_dim(config_), H = config_.heads;
  double forward = 2.0 * C * config_.vocab_size;  // output head
  for (const LayerSpec& spec : specs_) {
    if (spec.has_attention) {
      forward += 2.0 * C * (H + 2.0 * spec.kv_heads) * hd + 2.0 * H * hd * C;
      // Scores and weighted values over the causal prefix: (seq + 1) / 2 keys on average.
      forward += 2.0 * 2.0 * H * hd * (static_cast<double>(seq) + 1.0) / 2.0;
    }
    if (spec.has_mlp()) {
      const double in_width = config_.activation == "swiglu" ? 2.0 * spec.ffn_size : spec.ffn_size;
      forward += 2.0 * C * in_width + 2.0 * spec.ffn_size * C;
    }
  }
  return 3.0 * forward;
}

int64_t Transformer::activation_bytes() const {
  auto bytes = [](const Buffer& b) { return static_cast<int64_t>(b.size() * sizeof(float)); };
  auto saved_bytes = [&](const Block::Saved& s) {
    return bytes(s.norm1.out) + bytes(s.norm1.mean) + bytes(s.norm1.rstd) + bytes(s.norm2.out) +
           bytes(s.norm2.mean) + bytes(s.norm2.rstd) + bytes(s.attention.qkv) + bytes(s.attention.probs) +
           bytes(s.attention.att) + bytes(s.mlp.hidden) + bytes(s.mlp.act) + bytes(s.mid);
  };
  int64_t total = saved_bytes(shared_saved_) + bytes(logits_) + bytes(final_saved_.out);
  for (const Buffer& r : residual_) total += bytes(r);
  for (const Block::Saved& s : saved_) total += saved_bytes(s);
  return total;
}

}  // namespace loom::model
