#include "loom/model/transformer.h"

#include <algorithm>
#include <numeric>

#include "loom/core/error.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/vocab_parallel_cross_entropy.h"

namespace loom::model {

namespace k = loom::kernels::cpu;

Transformer::Transformer(const runtime::ModelConfig& config, TensorParallel tp, PrecisionPolicy precision)
    : config_(config), tp_(tp), specs_(resolve_layers(config)),
      precision_(std::make_shared<PrecisionContext>(precision)) {
  check(config.vocab_size > 0, "model.vocab_size must be resolved before building the model");
  const float std = static_cast<float>(config.init_std);
  const int64_t V = config.vocab_size, C = config.d_model;
  // Vocabulary rows split as evenly as they go (no padding): rank r holds [first(r), first(r+1)).
  vocab_first_ = balanced_first(V, tp_.size(), tp_.rank());
  vocab_local_ = balanced_first(V, tp_.size(), tp_.rank() + 1) - vocab_first_;
  unit_params_.resize(config.layers + 2);
  auto registered_since = [&](int unit, int first) {
    for (int id = first; id < static_cast<int>(params_.list().size()); ++id) unit_params_[unit].push_back(id);
  };
  embed_ = params_.add("model.embed_tokens.weight", {vocab_local_, C}, Init::Normal, std,
                       tp_.split({V, C}, 0, vocab_first_, vocab_local_));
  if (config.positions == "learned") {
    positions_ = params_.add("model.embed_positions.weight", {config.max_seq_len, config.d_model}, Init::Normal, std,
                             tp_.replicated());
  } else {
    rope_ = std::make_unique<k::RopeTable>(config.max_seq_len, head_dim(config), config.rope_theta);
  }
  registered_since(0, 0);
  blocks_.reserve(config.layers);
  for (int l = 0; l < config.layers; ++l) {
    const int first = static_cast<int>(params_.list().size());
    blocks_.emplace_back(params_, tp_, l, config, specs_[l], rope_.get());
    if (precision.recipe != Recipe::Fp32) blocks_.back().set_precision(*precision_, precision.block_recipe(l, config.layers));
    registered_since(l + 1, first);
  }
  const int head_first = static_cast<int>(params_.list().size());
  final_norm_.emplace(params_, "model.norm", config.d_model, config.norm == "layer",
                      static_cast<float>(config.norm_eps), tp_.replicated());
  head_ = config.tied_embeddings ? embed_
                                 : params_.add("lm_head.weight", {vocab_local_, C}, Init::Normal, std,
                                               tp_.split({V, C}, 0, vocab_first_, vocab_local_));
  registered_since(config.layers + 1, head_first);
  if (config.tied_embeddings) unit_params_[config.layers + 1].push_back(embed_);
  params_.allocate();
  residual_.resize(config.layers + 1);
  saved_.resize(config.recompute ? 0 : config.layers);
  tp_grads_.emplace(params_, tp_, unit_params_);
  head_precision_ = precision_->make(precision.head_recipe());
}

void Transformer::check_tokens(const int32_t* tokens, int64_t rows) const {
  for (int64_t r = 0; r < rows; ++r) {
    check(tokens[r] >= 0 && tokens[r] < config_.vocab_size,
          "token id " + std::to_string(tokens[r]) + " is outside the model's vocabulary [0, " +
              std::to_string(config_.vocab_size) + ")");
  }
}

void Transformer::embed(float* out, const int32_t* tokens, int64_t batch, int64_t seq, int64_t position_start) {
  const int64_t rows = batch * seq, local = tp_.local_rows(rows), first = tp_.first_local_row(rows);
  const int64_t C = config_.d_model;
  check_tokens(tokens, rows);
  if (tp_.single()) {
    k::embedding_forward(out, tokens, params_.value(embed_), rows, C, false);
  } else {
    // Each rank looks up the ids it holds; the sum over ranks (g) is the full lookup.
    float* partial = tp_.exit_forward_target(out, rows, C, tp_scratch_.partial);
    k::embedding_forward_shard(partial, tokens, params_.value(embed_), rows, C, vocab_first_, vocab_local_);
    std::fill(out, out + local * C, 0.0f);
    tp_.exit_forward(out, partial, nullptr, rows, C);
  }
  if (positions_ >= 0) {
    check(position_start + seq <= config_.max_seq_len,
          "sequence of " + std::to_string(position_start + seq) + " positions exceeds model.max_seq_len " +
              std::to_string(config_.max_seq_len));
    position_ids_.resize(local);
    for (int64_t r = 0; r < local; ++r) position_ids_[r] = static_cast<int32_t>(position_start + (first + r) % seq);
    k::embedding_forward(out, position_ids_.data(), params_.value(positions_), local, C, true);
  }
}

void Transformer::embed_backward(const float* d_x, const int32_t* tokens, int64_t rows) {
  const int64_t C = config_.d_model;
  const float* d_full = tp_.exit_backward(d_x, rows, C, tp_scratch_.gathered);
  if (tp_.single()) {
    k::embedding_backward(params_.grad(embed_), d_full, tokens, rows, C);
  } else {
    k::embedding_backward_shard(params_.grad(embed_), d_full, tokens, rows, C, vocab_first_, vocab_local_);
  }
  if (positions_ >= 0) {
    k::embedding_backward(params_.grad(positions_), d_x, position_ids_.data(), tp_.local_rows(rows), C);
  }
}

double Transformer::cross_entropy(const int32_t* targets, int64_t rows, float grad_scale) {
  float* logits = logits_.data();
  float* losses = sized(losses_, rows);
  if (tp_.single()) return k::softmax_cross_entropy(logits, losses, targets, rows, config_.vocab_size, grad_scale);
  // Vocabulary-parallel: two reductions of per-row scalars, never a full row of logits.
  for (int64_t r = 0; r < rows; ++r) {
    check(targets[r] == k::kIgnoreIndex || (targets[r] >= 0 && targets[r] < config_.vocab_size),
          "cross-entropy: target id " + std::to_string(targets[r]) + " is outside the vocabulary [0, " +
              std::to_string(config_.vocab_size) + ")");
  }
  float* row_max = sized(ce_max_, rows);
  k::vocab_shard_row_max(logits, rows, vocab_local_, row_max);
  tp_.all_reduce_max(row_max, rows);
  float* stats = sized(ce_stats_, 2 * rows);
  k::vocab_shard_exp_sums(logits, row_max, targets, rows, vocab_local_, vocab_first_, stats);
  tp_.all_reduce(stats, 2 * rows);
  return k::vocab_shard_finish(logits, losses, row_max, stats, targets, rows, vocab_local_, vocab_first_, grad_scale);
}

double Transformer::forward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                            float grad_scale) {
  check(seq <= config_.max_seq_len, "sequence length " + std::to_string(seq) + " exceeds model.max_seq_len " +
                                        std::to_string(config_.max_seq_len));
  const int64_t rows = batch * seq, C = config_.d_model;
  check(!tp_.sequence_parallel() || rows % tp_.size() == 0,
        "sequence parallelism splits the " + std::to_string(rows) + " tokens of a micro-batch (batch x seq) over " +
            std::to_string(tp_.size()) + " tensor-parallel ranks: they must divide evenly");
  const int64_t local = tp_.local_rows(rows);
  const int head_unit = config_.layers + 1;
  if (hooks_) hooks_->before_forward(0);
  embed(sized(residual_[0], local * C), inputs, batch, seq, 0);
  if (hooks_) hooks_->after_forward(0);
  for (int l = 0; l < config_.layers; ++l) {
    if (hooks_) hooks_->before_forward(l + 1);
    blocks_[l].forward(saved_for(l), residual_[l].data(), sized(residual_[l + 1], local * C), batch, seq,
                       tp_scratch_);
    if (hooks_) hooks_->after_forward(l + 1);
  }
  if (hooks_) hooks_->before_forward(head_unit);
  final_norm_->forward(final_saved_, residual_[config_.layers].data(), local);
  // The head is column-parallel over the vocabulary; its input (all rows) is kept for backward.
  const float* head_in = final_saved_.out.data();
  if (tp_.sequence_parallel()) {
    head_in = tp_.enter_forward(final_saved_.out.data(), rows, C, head_input_);
  }
  float* logits = sized(logits_, rows * vocab_local_);
  if (head_precision_) {
    head_precision_->forward(logits, head_in, params_.value(head_), nullptr, rows, C, vocab_local_);
  } else {
    k::linear_forward(logits, head_in, params_.value(head_), nullptr, rows, C, vocab_local_);
  }
  const double loss_sum = cross_entropy(targets, rows, grad_scale);
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
  const int64_t rows = batch * seq, C = config_.d_model, local = tp_.local_rows(rows);
  // logits_ now holds d(loss)/d(logits).
  const int head_unit = config_.layers + 1;
  auto begin_unit = [&](int unit) {
    if (hooks_) hooks_->before_backward(unit);
    tp_grads_->begin_unit(unit);
  };
  auto finish_unit = [&](int unit) {
    tp_grads_->finish_unit(unit);
    if (hooks_) hooks_->after_backward(unit);
  };
  begin_unit(head_unit);
  float* d_final = zeroed(d_final_, local * C);
  const float* head_in = tp_.sequence_parallel() ? head_input_.data() : final_saved_.out.data();
  float* d_head_in = tp_.enter_backward_target(d_final, rows, C, tp_scratch_.d_full);
  if (head_precision_) {
    head_precision_->backward(d_head_in, params_.grad(head_), nullptr, logits_.data(), head_in, params_.value(head_),
                              rows, C, vocab_local_);
  } else {
    k::linear_backward(d_head_in, params_.grad(head_), nullptr, logits_.data(), head_in, params_.value(head_), rows, C,
                       vocab_local_);
  }
  tp_.enter_backward(d_final, d_head_in, rows, C);
  float* d_x = zeroed(d_residual_, local * C);
  final_norm_->backward(d_x, d_final, residual_[config_.layers].data(), final_saved_, local);
  finish_unit(head_unit);
  for (int l = config_.layers - 1; l >= 0; --l) {
    begin_unit(l + 1);
    if (config_.recompute) {
      blocks_[l].forward(shared_saved_, residual_[l].data(), sized(recompute_out_, local * C), batch, seq,
                         tp_scratch_);
    }
    blocks_[l].backward(d_x, residual_[l].data(), saved_for(l), work_, batch, seq, tp_scratch_);
    finish_unit(l + 1);
  }
  begin_unit(0);
  embed_backward(d_x, inputs, rows);
  finish_unit(0);
  return loss_sum;
}

const float* Transformer::decode(DecodeState& state, const int32_t* tokens, int64_t count) {
  check(tp_.single(), "generation runs on one rank: load the checkpoint with parallel.tp = 1");
  const int64_t C = config_.d_model, V = config_.vocab_size, max_positions = config_.max_seq_len;
  check(state.length + count <= max_positions,
        "generation reached model.max_seq_len " + std::to_string(max_positions) + " positions");
  if (state.caches.size() != blocks_.size()) state.caches.resize(blocks_.size());
  float* x = sized(state.x, count * C);
  embed(x, tokens, 1, count, state.length);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].decode(x, count, state.length, state.caches[l], state.scratch, state.tp_scratch, max_positions);
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
  int64_t total = saved_bytes(shared_saved_) + bytes(logits_) + bytes(final_saved_.out) + bytes(head_input_);
  for (const Buffer& r : residual_) total += bytes(r);
  for (const Block::Saved& s : saved_) total += saved_bytes(s);
  return total;
}

}  // namespace loom::model
