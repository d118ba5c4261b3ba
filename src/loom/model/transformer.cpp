#include "loom/model/transformer.h"

#include <algorithm>
#include <numeric>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/model/flops.h"

namespace loom::model {

namespace {
void check_chunks(const std::vector<LayerRange>& chunks, int layers) {
  for (size_t c = 0; c < chunks.size(); ++c) {
    const int floor = c == 0 ? 0 : chunks[c - 1].last;
    LOOM_CHECK(chunks[c].first >= floor && chunks[c].first < chunks[c].last && chunks[c].last <= layers,
               "model chunk " + std::to_string(c) + " holds layers [" + std::to_string(chunks[c].first) + ", " +
                   std::to_string(chunks[c].last) + "): chunks need at least one layer each, in order, within the " +
                   std::to_string(layers) + " layers");
  }
}
}  // namespace

Transformer::Transformer(const config::ModelConfig& config, TensorParallel tp, PrecisionPolicy precision,
                         std::vector<LayerRange> chunks, ExpertLayout experts, Device device)
    : Transformer(config, std::move(tp), precision, std::move(chunks), ParameterStore::Allocation::Buffers, experts,
                  device) {}

std::vector<Parameter> Transformer::parameter_list(const config::ModelConfig& config, TensorParallel tp,
                                                   std::vector<LayerRange> chunks, ExpertLayout experts) {
  const Transformer shapes(config, std::move(tp), {}, std::move(chunks), ParameterStore::Allocation::ShapesOnly,
                           experts, Device::cpu());
  return shapes.params().list();
}

Transformer::Transformer(const config::ModelConfig& config, TensorParallel tp, PrecisionPolicy precision,
                         std::vector<LayerRange> chunks, ParameterStore::Allocation allocation,
                         ExpertLayout experts, Device device)
    : config_(config), tp_(tp), specs_(resolve_layers(config)), chunks_(std::move(chunks)),
      params_(device, allocation), precision_(std::make_shared<PrecisionContext>(precision)) {
  LOOM_CHECK(config.vocab_size > 0, "model.vocab_size must be resolved before building the model");
  tp_.set_device(device);
  if (device.is_cuda()) precision_->set_device(device);  // the linear layers' GEMMs in the recipe's real formats
  const int L = config.layers;
  if (chunks_.empty()) chunks_.push_back({0, L});
  check_chunks(chunks_, L);
  const float std = static_cast<float>(config.init_std);
  const int64_t V = config.vocab_size, C = config.d_model;
  // Vocabulary rows split as evenly as they go (no padding): rank r holds [first(r), first(r+1)).
  vocab_first_ = balanced_first(V, tp_.size(), tp_.rank());
  vocab_local_ = balanced_first(V, tp_.size(), tp_.rank() + 1) - vocab_first_;
  unit_params_.resize(L + 2);
  auto registered_since = [&](int unit, int first) {
    for (int id = first; id < static_cast<int>(params_.list().size()); ++id) unit_params_[unit].push_back(id);
  };
  const bool first_stage = chunks_.front().first == 0, last_stage = chunks_.back().last == L;
  if (first_stage) {
    embed_ = params_.add("model.embed_tokens.weight", {vocab_local_, C}, Init::Normal, std,
                         tp_.split({V, C}, 0, vocab_first_, vocab_local_));
    if (config.positions == config::Positions::Learned) {
      positions_ = params_.add("model.embed_positions.weight", {config.max_seq_len, config.d_model}, Init::Normal,
                               std, tp_.replicated());
    }
    registered_since(0, 0);
  }
  if (config.positions == config::Positions::Rope && !params_.shapes_only()) {
    rope_ = std::make_unique<kernels::RopeTable>(config.max_seq_len, head_dim(config), config.rope_theta,
                                                 rope_scaling(config));
  }
  block_index_.assign(L, -1);
  blocks_.reserve(L);
  for (const LayerRange& chunk : chunks_) {
    for (int l = chunk.first; l < chunk.last; ++l) {
      const int first = static_cast<int>(params_.list().size());
      block_index_[l] = static_cast<int>(blocks_.size());
      blocks_.emplace_back(params_, tp_, l, config, specs_[l], rope_.get(), experts);
      if (precision.recipe != Recipe::Fp32) blocks_.back().set_precision(*precision_, precision.block_recipe(l, L));
      blocks_.back().set_attention_operands(precision.attention_operands());
      registered_since(l + 1, first);
    }
  }
  if (last_stage) {
    const int head_first = static_cast<int>(params_.list().size());
    final_norm_.emplace(params_, "model.norm", config.d_model, config.norm == config::Norm::Layer,
                        static_cast<float>(config.norm_eps), tp_.replicated());
    // A tied head on the last pipeline stage is a copy of the first stage's embedding: same
    // name and initial values, gradient summed over the embedding group, counted in the norm
    // (and written to checkpoints) by the first stage only. Multi-token prediction's lookups
    // use such a copy too.
    auto embedding_copy = [&] {
      ShardSpec spec = tp_.split({V, C}, 0, vocab_first_, vocab_local_);
      spec.counts_in_norm = false;
      return embedding_copy_ = params_.add("model.embed_tokens.weight", {vocab_local_, C}, Init::Normal, std, spec);
    };
    if (config.tied_embeddings) {
      head_ = embed_ >= 0 ? embed_ : embedding_copy();
    } else {
      head_ = params_.add("lm_head.weight", {vocab_local_, C}, Init::Normal, std,
                          tp_.split({V, C}, 0, vocab_first_, vocab_local_));
    }
    if (config.mtp_depths > 0) {
      mtp_embed_ = embed_ >= 0 ? embed_ : embedding_copy_ >= 0 ? embedding_copy_ : embedding_copy();
      build_mtp(config, precision, experts);
    }
    registered_since(L + 1, head_first);
    // The head unit reads the first stage's embedding too when it is on this rank (tied, MTP).
    if (embed_ >= 0 && (head_ == embed_ || mtp_embed_ == embed_)) unit_params_[L + 1].push_back(embed_);
    head_precision_ = precision_->make(precision.head_recipe(), "lm_head");
  }
  params_.allocate();
  for (MoeLayer* m : moe_layers()) m->set_scratch(&moe_scratch_);
  if (!params_.shapes_only()) tp_grads_.emplace(params_, tp_, unit_params_);
}

namespace {
int64_t buffer_bytes(const Buffer& x) { return static_cast<int64_t>(x.size() * sizeof(float)); }
int64_t saved_bytes(const Block::Saved& s) {
  auto b = buffer_bytes;
  return b(s.norm1.out) + b(s.norm1.mean) + b(s.norm1.rstd) + b(s.norm2.out) + b(s.norm2.mean) + b(s.norm2.rstd) +
         b(s.attention.qkv) + b(s.attention.lse) + b(s.attention.att) + b(s.mlp.hidden) + b(s.mlp.act) + b(s.mid) +
         b(s.moe.gathered) + b(s.moe.routing.logits) + b(s.moe.latent) + b(s.moe.dispatched) + b(s.moe.expert_in) +
         b(s.moe.returned) + b(s.moe.combined) + b(s.moe.experts.hidden) + b(s.moe.experts.act) +
         b(s.moe.shared.hidden) + b(s.moe.shared.act) + b(s.attention.qkv_codes) + b(s.attention.out_codes) +
         b(s.mlp.up_codes) + b(s.mlp.down_codes) + b(s.moe.shared.up_codes) + b(s.moe.shared.down_codes);
}
}  // namespace

int64_t Activations::bytes() const {
  auto b = buffer_bytes;
  int64_t total = b(logits) + b(head_input) + b(d_x) + b(final_norm.out) + b(final_norm.mean) + b(final_norm.rstd);
  total += static_cast<int64_t>(position_ids.size() * sizeof(int32_t));
  for (const Buffer& r : residual) total += b(r);
  for (const Block::Saved& s : saved) total += saved_bytes(s);
  for (const MtpDepth::Saved& s : mtp) total += s.bytes() + saved_bytes(s.block);
  return total;
}

void Transformer::check_whole_model(const std::string& what) const {
  LOOM_CHECK(chunks_.size() == 1 && chunks_[0].first == 0 && chunks_[0].last == config_.layers,
        what + " needs the whole model on this rank; a pipeline stage runs chunks (forward_chunk / backward_chunk)");
}

Block::Saved& Transformer::saved_for(Activations& a, int layer) {
  if (config_.recompute) return shared_saved_;
  if (a.saved.size() != static_cast<size_t>(config_.layers)) a.saved.resize(config_.layers);
  return a.saved[layer];
}

void Transformer::check_tokens(const int32_t* tokens, int64_t rows) const {
  for (int64_t r = 0; r < rows; ++r) {
    LOOM_CHECK(tokens[r] >= 0 && tokens[r] < config_.vocab_size,
          "token id " + std::to_string(tokens[r]) + " is outside the model's vocabulary [0, " +
              std::to_string(config_.vocab_size) + ")");
  }
}

void Transformer::set_context_attention(ContextAttention* context) {
  context_ = context;
  for (Block& block : blocks_) block.set_context(context);
  for (MtpDepth& depth : mtp_) depth.block().set_context(context);
}

Packing Transformer::staged_packing(const Packing& packing, int64_t rows) {
  const Device device = params_.device();
  return {staged_positions_.stage(device, packing.positions, rows), staged_documents_.stage(device, packing.documents, rows)};
}

void Transformer::check_packing(const Packing& packing, int64_t rows) const {
  if (packing.positions == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    LOOM_CHECK(packing.positions[r] >= 0 && packing.positions[r] < config_.max_seq_len,
               "token position " + std::to_string(packing.positions[r]) + " is outside [0, model.max_seq_len " +
                   std::to_string(config_.max_seq_len) + ")");
  }
}

void Transformer::embed(float* out, const int32_t* tokens, int64_t batch, int64_t seq, int64_t position_start,
                        const int32_t* positions, std::vector<int32_t>& position_ids) {
  const int64_t rows = batch * seq, local = tp_.local_rows(rows), first = tp_.first_local_row(rows);
  const int64_t C = config_.d_model;
  lookup_tokens(out, tokens, rows, embed_);
  if (positions_ >= 0) {
    LOOM_CHECK(position_start + global_seq(seq) <= config_.max_seq_len,
          "sequence of " + std::to_string(position_start + global_seq(seq)) + " positions exceeds model.max_seq_len " +
              std::to_string(config_.max_seq_len));
    position_ids.resize(local);
    for (int64_t r = 0; r < local; ++r) {
      const int64_t t = (first + r) % seq;
      const int64_t at = context_ != nullptr ? context_position(context_->size(), context_->rank(), seq, t) : t;
      position_ids[r] = positions != nullptr ? positions[first + r] : static_cast<int32_t>(position_start + at);
    }
    const int32_t* ids = staged_position_ids_.stage(params_.device(), position_ids.data(), local);
    kernels::embedding_forward(params_.device(), out, ids, params_.value(positions_), local, C, true);
  }
}

void Transformer::lookup_tokens(float* out, const int32_t* tokens, int64_t rows, int table) {
  const int64_t C = config_.d_model, local = tp_.local_rows(rows);
  check_tokens(tokens, rows);
  tokens = staged_tokens_.stage(params_.device(), tokens, rows);
  if (tp_.single()) {
    kernels::embedding_forward(params_.device(), out, tokens, params_.value(table), rows, C, false);
    return;
  }
  // Each rank looks up the ids it holds; the sum over ranks (g) is the full lookup.
  float* partial = tp_.exit_forward_target(out, rows, C, tp_scratch_.partial);
  kernels::embedding_forward_shard(params_.device(), partial, tokens, params_.value(table), rows, C, vocab_first_,
                                   vocab_local_);
  allocator(params_.device()).zero(out, static_cast<size_t>(local * C) * sizeof(float));
  tp_.exit_forward(out, partial, nullptr, rows, C);
}

void Transformer::lookup_tokens_backward(const float* d_out, const int32_t* tokens, int64_t rows, int table) {
  const int64_t C = config_.d_model;
  const float* d_full = tp_.exit_backward(d_out, rows, C, tp_scratch_.gathered);
  tokens = staged_tokens_.stage(params_.device(), tokens, rows);
  if (tp_.single()) {
    kernels::embedding_backward(params_.device(), params_.grad(table), d_full, tokens, rows, C);
  } else {
    kernels::embedding_backward_shard(params_.device(), params_.grad(table), d_full, tokens, rows, C, vocab_first_,
                                      vocab_local_);
  }
}

void Transformer::embed_backward(const float* d_x, const int32_t* tokens, int64_t rows,
                                 const std::vector<int32_t>& position_ids) {
  const int64_t C = config_.d_model;
  lookup_tokens_backward(d_x, tokens, rows, embed_);
  if (positions_ >= 0) {
    const int64_t local = tp_.local_rows(rows);
    kernels::embedding_backward(params_.device(), params_.grad(positions_), d_x,
                                staged_position_ids_.stage(params_.device(), position_ids.data(), local), local, C);
  }
}

double Transformer::cross_entropy(float* logits, const int32_t* targets, int64_t rows, float grad_scale,
                                  bool model_rows) {
  if (objective_ != nullptr && model_rows) return objective_loss(logits, targets, rows, grad_scale);
  float* losses = sized(losses_, rows, params_.device());
  if (tp_.single()) {
    return kernels::softmax_cross_entropy(params_.device(), logits, losses,
                                          staged_targets_.stage(params_.device(), targets, rows), rows,
                                          config_.vocab_size, grad_scale);
  }
  // Vocabulary-parallel: two reductions of per-row scalars, never a full row of logits.
  for (int64_t r = 0; r < rows; ++r) {
    LOOM_CHECK(targets[r] == kernels::kIgnoreIndex || (targets[r] >= 0 && targets[r] < config_.vocab_size),
               "cross-entropy: target id " + std::to_string(targets[r]) + " is outside the vocabulary [0, " +
                   std::to_string(config_.vocab_size) + ")");
  }
  const Device device = params_.device();
  targets = staged_targets_.stage(device, targets, rows);
  float* row_max = sized(ce_max_, rows, device);
  kernels::vocab_shard_row_max(device, logits, rows, vocab_local_, row_max);
  tp_.all_reduce_max(row_max, rows);
  float* stats = sized(ce_stats_, 2 * rows, device);
  kernels::vocab_shard_exp_sums(device, logits, row_max, targets, rows, vocab_local_, vocab_first_, stats);
  tp_.all_reduce(stats, 2 * rows);
  return kernels::vocab_shard_finish(device, logits, losses, row_max, stats, targets, rows, vocab_local_, vocab_first_,
                                     grad_scale);
}

double Transformer::objective_loss(float* logits, const int32_t* targets, int64_t rows, float grad_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    LOOM_CHECK(targets[r] == kernels::kIgnoreIndex || (targets[r] >= 0 && targets[r] < config_.vocab_size),
               "objective: target id " + std::to_string(targets[r]) + " is outside the vocabulary [0, " +
                   std::to_string(config_.vocab_size) + ")");
  }
  // The vocabulary-parallel passes (one rank: a single shard), then each row's log-probability.
  const Device device = params_.device();
  const int32_t* device_targets = staged_targets_.stage(device, targets, rows);
  float* row_max = sized(ce_max_, rows, device);
  kernels::vocab_shard_row_max(device, logits, rows, vocab_local_, row_max);
  if (!tp_.single()) tp_.all_reduce_max(row_max, rows);
  float* stats = sized(ce_stats_, 2 * rows, device);
  kernels::vocab_shard_exp_sums(device, logits, row_max, device_targets, rows, vocab_local_, vocab_first_, stats);
  if (!tp_.single()) tp_.all_reduce(stats, 2 * rows);
  float* losses = sized(objective_logp_, rows, device);
  kernels::vocab_shard_finish(device, logits, losses, row_max, stats, device_targets, rows, vocab_local_, vocab_first_,
                              0.0f);
  // The objective is host code: the rows' log-probabilities come to it, their gradients go back.
  host_logp_.resize(rows);
  host_scale_.resize(rows);
  copy_to_host(device, host_logp_.data(), losses, rows);
  for (float& logp : host_logp_) logp = -logp;  // the loss -logp, negated
  const double loss_sum = objective_->evaluate(targets, host_logp_.data(), rows, host_scale_.data());
  if (grad_scale == 0.0f) return loss_sum;
  // d(loss)/d(logits) = g (onehot - softmax) = (-g) (softmax - onehot).
  for (float& g : host_scale_) g *= -grad_scale;
  float* scale = sized(objective_scale_, rows, device);
  copy_from_host(device, scale, host_scale_.data(), rows);
  kernels::vocab_shard_gradient(device, logits, row_max, stats, device_targets, rows, vocab_local_, vocab_first_, scale);
  return loss_sum;
}

bool Transformer::bf16_logits() const {
  return head_precision_ && head_precision_->takes_bf16_tensors() && tp_.single() && objective_ == nullptr;
}

double Transformer::head_forward(Activations& a, const int32_t* targets, int64_t rows, float grad_scale) {
  final_norm_->forward(a.final_norm, a.residual[config_.layers].data(), tp_.local_rows(rows));
  return head_loss(a.final_norm.out.data(), a.head_input, a.logits, targets, rows, grad_scale, true);
}

double Transformer::head_loss(const float* normed, Buffer& head_input, Buffer& logits_out, const int32_t* targets,
                              int64_t rows, float grad_scale, bool model_rows) {
  const int64_t C = config_.d_model;
  // The head is column-parallel over the vocabulary; its input (all rows) is kept for backward.
  const float* head_in = normed;
  if (tp_.sequence_parallel()) head_in = tp_.enter_forward(normed, rows, C, head_input);
  if (bf16_logits()) {
    void* logits16 = sized_16bit(logits_out, rows * vocab_local_, params_.device());
    head_precision_->forward(nullptr, head_in, params_.value(head_), nullptr, rows, C, vocab_local_, false,
                             GemmOutput::Rounded, DeviceTensors{.out = logits16});
    const Device device = params_.device();
    return kernels::softmax_cross_entropy_bf16(device, logits16, sized(losses_, rows, device),
                                               staged_targets_.stage(device, targets, rows), rows, config_.vocab_size,
                                               grad_scale);
  }
  float* logits = sized(logits_out, rows * vocab_local_, params_.device());
  head_logits(logits, head_in, rows);
  return cross_entropy(logits, targets, rows, grad_scale, model_rows);
}

void Transformer::head_backward(Activations& a, int64_t batch, int64_t seq, const Packing& staged,
                                ResidualGradForReader& for_reader) {
  const int64_t rows = batch * seq, local = tp_.local_rows(rows), n = local * config_.d_model;
  const Device device = params_.device();
  float* d_x = zeroed(a.d_x, n, device);
  const bool bf16 = for_reader.reader_takes_bf16();
  void* d_x16_out = bf16 ? sized_16bit(work_.d_residual16, n, device) : nullptr;
  float* d_normed = head_grad(a.final_norm.out.data(), a.head_input, a.logits, rows, d_final_, true);
  // The depths add their gradient of the final norm's output (depth 1's hnorm) before its backward.
  if (depths_run()) mtp_backward(a, batch, seq, staged, d_normed);
  float* amax = for_reader.reader_amax();
  final_norm_->backward(d_x, d_normed, a.residual[config_.layers].data(), a.final_norm, local, d_x16_out, amax);
  for_reader.amax = amax;
  for_reader.current = bf16;
}

float* Transformer::head_grad(const float* normed, const Buffer& head_input, const Buffer& logits, int64_t rows,
                              Buffer& out, bool weight_gradient) {
  const int64_t C = config_.d_model, local = tp_.local_rows(rows);
  // logits holds d(loss)/d(logits). The head's input gradient is written whole (d_final and the
  // tensor-parallel target are not zeroed first).
  float* d_final = sized(out, local * C, params_.device());
  const float* head_in = tp_.sequence_parallel() ? head_input.data() : normed;
  float* d_head_in = tp_.enter_backward_target(d_final, rows, C, tp_scratch_.d_full, false);
  float* d_weight = weight_gradient ? params_.grad(head_) : nullptr;
  if (bf16_logits()) {  // the loss's bf16 gradient, multiplied as it is
    head_precision_->backward(d_head_in, d_weight, nullptr, nullptr, head_in, params_.value(head_), rows, C,
                              vocab_local_, GemmOutput::Rounded, false, DeviceTensors{.dout = logits.data()});
  } else if (head_precision_) {
    // Each vocabulary shard's input gradient is a partial sum: rounded once, after the sum over ranks.
    head_precision_->backward(d_head_in, d_weight, nullptr, logits.data(), head_in, params_.value(head_),
                              rows, C, vocab_local_, tp_.single() ? GemmOutput::Rounded : GemmOutput::Partial, false);
  } else {
    kernels::linear_backward(params_.device(), d_head_in, d_weight, nullptr, logits.data(), head_in,
                             params_.value(head_), rows, C, vocab_local_, false);
  }
  tp_.enter_backward(d_final, d_head_in, rows, C, head_precision_.get(), false);
  return d_final;
}

float* Transformer::chunk_input(Activations& a, int chunk, int64_t rows) {
  if (a.residual.size() != static_cast<size_t>(config_.layers + 1)) a.residual.resize(config_.layers + 1);
  return sized(a.residual[chunks_.at(chunk).first], stage_rows(rows) * config_.d_model, params_.device());
}

const float* Transformer::chunk_output(const Activations& a, int chunk) const {
  return a.residual.at(chunks_.at(chunk).last).data();
}

float* Transformer::chunk_output_grad(Activations& a, int64_t rows) {
  return sized(a.d_x, stage_rows(rows) * config_.d_model, params_.device());
}

double Transformer::forward_chunk(Activations& a, int chunk, const int32_t* inputs, const int32_t* targets,
                                  int64_t batch, int64_t seq, float grad_scale, const Packing& packing) {
  LOOM_CHECK(global_seq(seq) <= config_.max_seq_len, "sequence length " + std::to_string(global_seq(seq)) +
                                                        " exceeds model.max_seq_len " + std::to_string(config_.max_seq_len));
  const int64_t rows = batch * seq, C = config_.d_model;
  LOOM_CHECK(!tp_.sequence_parallel() || rows % tp_.size() == 0,
        "sequence parallelism splits the " + std::to_string(rows) + " tokens of a micro-batch (batch x seq) over " +
            std::to_string(tp_.size()) + " tensor-parallel ranks: they must divide evenly");
  const int64_t local = tp_.local_rows(rows);
  const LayerRange range = chunks_.at(chunk);
  if (a.residual.size() != static_cast<size_t>(config_.layers + 1)) a.residual.resize(config_.layers + 1);
  check_packing(packing, rows);
  const Device device = params_.device();
  if (range.first == 0) {
    trace::Range trace_range("embedding forward");
    if (hooks_) hooks_->before_forward(0);
    embed(sized(a.residual[0], local * C, device), inputs, batch, seq, 0, packing.positions, a.position_ids);
    if (hooks_) hooks_->after_forward(0);
  }
  const Packing staged = staged_packing(packing, rows);
  // A block's residual add left for the next block's first norm where both can (Block's
  // ResidualLink); the chunk's last block writes its output.
  ResidualLink link;
  for (int l = range.first; l < range.last; ++l) {
    trace::Range trace_range("block", l, "forward");
    if (hooks_) hooks_->before_forward(l + 1);
    link.leave_product = l + 1 < range.last && block(l).leaves_product() && block(l + 1).adds_product_in();
    Block::Saved& saved = saved_for(a, l);
    float* out = sized(a.residual[l + 1], local * C, device);
    block(l).forward(saved, a.residual[l].data(), out, batch, seq, staged, tp_scratch_, link);
    link = link.leave_product ? ResidualLink{saved.mid.data(), tp_scratch_.product16.data(), out} : ResidualLink{};
    if (hooks_) hooks_->after_forward(l + 1);
  }
  if (range.last != config_.layers) return 0.0;
  const int head_unit = config_.layers + 1;
  trace::Range trace_range("head forward");
  if (hooks_) hooks_->before_forward(head_unit);
  const double loss_sum = head_forward(a, targets, rows, grad_scale);
  // Under a token objective (GRPO) the depths run only where it asks for their loss, which trains
  // them alone (TokenObjective::depth_loss_weight).
  if (depths_run()) mtp_forward(a, inputs, targets, batch, seq, grad_scale, packing, staged);
  if (hooks_) hooks_->after_forward(head_unit);
  return loss_sum;
}

void Transformer::backward_chunk(Activations& a, int chunk, const int32_t* inputs, int64_t batch, int64_t seq,
                                 const Packing& packing) {
  const int64_t rows = batch * seq, local = tp_.local_rows(rows);
  const LayerRange range = chunks_.at(chunk);
  auto begin_unit = [&](int unit) {
    if (hooks_) hooks_->before_backward(unit);
    tp_grads_->begin_unit(unit);
  };
  auto finish_unit = [&](int unit) {
    params_.settle_grads(unit_parameters(unit));  // whatever its backward left stale reads as zero
    tp_grads_->finish_unit(unit);
    if (hooks_) hooks_->after_backward(unit);
  };
  // d_x in bf16, or its amax, for the output projections that take it, written by the norms that
  // update d_x (none where d_x came from the next pipeline stage).
  ResidualGradForReader for_reader;
  auto reader = [&](int l) -> const Block* { return l >= range.first ? &block(l) : nullptr; };
  const Packing staged = staged_packing(packing, rows);
  if (range.last == config_.layers) {
    trace::Range trace_range("head backward");
    const int head_unit = config_.layers + 1;
    begin_unit(head_unit);
    for_reader.reader = reader(range.last - 1);
    head_backward(a, batch, seq, staged, for_reader);
    finish_unit(head_unit);
  }
  float* d_x = a.d_x.data();  // d(loss)/d(chunk output), from the head or the next stage
  for (int l = range.last - 1; l >= range.first; --l) {
    trace::Range trace_range("block", l, "backward");
    begin_unit(l + 1);
    if (config_.recompute) {
      block(l).forward(shared_saved_, a.residual[l].data(),
                       sized(recompute_out_, local * config_.d_model, params_.device()), batch, seq, staged,
                       tp_scratch_);
    }
    for_reader.reader = reader(l - 1);
    block(l).backward(d_x, for_reader, a.residual[l].data(), saved_for(a, l), work_, batch, seq, staged,
                      tp_scratch_);
    finish_unit(l + 1);
  }
  if (range.first == 0) {
    trace::Range trace_range("embedding backward");
    begin_unit(0);
    embed_backward(d_x, inputs, rows, a.position_ids);
    finish_unit(0);
  }
}

double Transformer::forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                                 const Packing& packing) {
  check_whole_model("forward_loss");
  return forward_chunk(activations_, 0, inputs, targets, batch, seq, 0.0f, packing);
}

double Transformer::forward_backward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                                     float grad_scale, const Packing& packing) {
  LOOM_CHECK(grad_scale != 0.0f, "forward_backward: grad_scale must be non-zero");
  check_whole_model("forward_backward");
  double loss_sum = 0.0;
  {
    trace::Range trace_range("forward");
    loss_sum = forward_chunk(activations_, 0, inputs, targets, batch, seq, grad_scale, packing);
  }
  trace::Range trace_range("backward");
  backward_chunk(activations_, 0, inputs, batch, seq, packing);
  return loss_sum;
}

const float* Transformer::decode(DecodeState& state, const int32_t* tokens, int64_t count) {
  LOOM_CHECK(tp_.single(), "generation runs on one rank: load the checkpoint with parallel.tp = 1");
  check_whole_model("generation");
  const Device device = params_.device();
  const int64_t C = config_.d_model, V = config_.vocab_size, max_positions = config_.max_seq_len;
  LOOM_CHECK(state.length + count <= max_positions,
        "generation reached model.max_seq_len " + std::to_string(max_positions) + " positions");
  if (state.caches.size() != blocks_.size()) state.caches.resize(blocks_.size());
  float* x = sized(state.x, count * C, device);
  std::vector<int32_t> position_ids;
  embed(x, tokens, 1, count, state.length, nullptr, position_ids);
  for (size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].decode(x, count, state.length, state.caches[l], state.scratch, state.tp_scratch, max_positions);
  }
  state.length += count;
  final_norm_->forward(state.final_norm, x + (count - 1) * C, 1);
  float* logits = sized(state.logits, V, device);
  head_logits(logits, state.final_norm.out.data(), 1);
  if (device.is_cpu()) return logits;
  state.host_logits.resize(static_cast<size_t>(V));  // sampling reads them on the host
  copy_to_host(device, state.host_logits.data(), logits, V);
  return state.host_logits.data();
}

std::vector<MoeLayer*> Transformer::moe_layers() {
  std::vector<MoeLayer*> out;
  for (Block& b : blocks_) {
    if (b.moe()) out.push_back(b.moe());
  }
  for (MtpDepth& d : mtp_) {
    if (d.block().moe()) out.push_back(d.block().moe());
  }
  return out;
}

std::vector<const MoeLayer*> Transformer::moe_layers() const {
  std::vector<const MoeLayer*> out;
  for (const Block& b : blocks_) {
    if (b.moe()) out.push_back(b.moe());
  }
  for (const MtpDepth& d : mtp_) {
    if (d.block().moe()) out.push_back(d.block().moe());
  }
  return out;
}

void Transformer::set_expert_comm(ExpertComm* comm) {
  for (MoeLayer* m : moe_layers()) m->set_comm(comm);
}

void Transformer::set_aux_loss_scale(float scale) {
  for (MoeLayer* m : moe_layers()) m->set_aux_scale(scale);
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
  double total = head_training_flops_per_token(config_, seq);
  for (const LayerSpec& spec : specs_) total += layer_training_flops_per_token(config_, spec, seq);
  return total;
}

int64_t Transformer::activation_bytes() const { return activations_.bytes() + saved_bytes(shared_saved_); }

}  // namespace loom::model
