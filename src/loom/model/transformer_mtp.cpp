// Multi-token prediction on the rank holding the head (multi_token_prediction.h): the depths run
// after the main head's loss, in the head's unit, and their backward before the main model's.
// Under a token objective (GRPO) whose depth_loss_weight() is not 0 they run too, their loss
// training the depths alone: their gradient of the main model's output, of the embedding they
// read and of the shared head's weight is dropped.
#include <algorithm>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/types.h"
#include "loom/model/context_attention.h"
#include "loom/model/transformer.h"

namespace loom::model {

namespace {

// Context parallelism: the values of this rank's tokens (context_position) out of whole-sequence
// rows [batch, size * seq].
void keep_context_share(std::vector<int32_t>& values, int64_t batch, int64_t seq, int size, int rank) {
  std::vector<int32_t> mine(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      mine[static_cast<size_t>(b * seq + t)] =
          values[static_cast<size_t>(b * seq * size + context_position(size, rank, seq, t))];
    }
  }
  values.swap(mine);
}

}  // namespace

void Transformer::build_mtp(const config::ModelConfig& config, const PrecisionPolicy& precision,
                            ExpertLayout experts) {
  const int modules = config.mtp_use_repeated_layer && config.mtp_depths > 0 ? 1 : config.mtp_depths;
  mtp_.reserve(modules);
  for (int k = 1; k <= modules; ++k) {
    mtp_.emplace_back(params_, tp_, k, config, rope_.get(), experts);
    // The blocks' GEMMs follow the last layer's recipe; eh_proj stays fp32.
    if (precision.recipe != Recipe::Fp32) {
      mtp_.back().block().set_precision(*precision_, precision.block_recipe(config.layers - 1, config.layers));
    }
    mtp_.back().block().set_attention_operands(precision.attention_operands());
  }
  mtp_totals_ = {std::vector<double>(config.mtp_depths, 0.0), std::vector<double>(config.mtp_depths, 0.0)};
  last_mtp_.assign(config.mtp_depths, 0.0);
}

double Transformer::depth_loss_weight() const {
  return objective_ == nullptr ? config_.mtp_loss_weight : objective_->depth_loss_weight();
}

MtpTotals Transformer::take_mtp_totals() {
  MtpTotals out = mtp_totals_;
  std::fill(mtp_totals_.loss_sums.begin(), mtp_totals_.loss_sums.end(), 0.0);
  std::fill(mtp_totals_.tokens.begin(), mtp_totals_.tokens.end(), 0.0);
  return out;
}

void Transformer::mtp_forward(Activations& a, const int32_t* inputs, const int32_t* targets, int64_t batch,
                              int64_t seq, float grad_scale, const Packing& packing, const Packing& staged) {
  LOOM_CHECK(inputs != nullptr, "multi-token prediction (model.mtp_depths) needs the input tokens on the last stage");
  const int64_t rows = batch * seq, local = tp_.local_rows(rows), C = config_.d_model;
  const int depths = mtp_depths();
  // Each depth's loss enters the objective with weight depth_loss_weight() / depths.
  const float scale = grad_scale * static_cast<float>(depth_loss_weight() / depths);
  if (a.mtp.size() != static_cast<size_t>(depths)) a.mtp.resize(depths);
  const float* h_prev = a.final_norm.out.data();  // the main model's output (head_forward ran)
  // Context parallelism: the depths look ahead within whole sequences (the token k ahead of one
  // of this rank's may sit on another rank), then keep this rank's tokens.
  const int32_t *ahead_inputs = inputs, *ahead_targets = targets, *ahead_documents = packing.documents;
  if (context_ != nullptr) {
    const auto whole = static_cast<size_t>(batch * global_seq(seq));
    mtp_whole_inputs_.resize(whole);
    mtp_whole_targets_.resize(whole);
    context_->gather_sequences(mtp_whole_inputs_.data(), inputs, batch, seq);
    context_->gather_sequences(mtp_whole_targets_.data(), targets, batch, seq);
    ahead_inputs = mtp_whole_inputs_.data();
    ahead_targets = mtp_whole_targets_.data();
    if (packing.documents != nullptr) {
      mtp_whole_documents_.resize(whole);
      context_->gather_sequences(mtp_whole_documents_.data(), packing.documents, batch, seq);
      ahead_documents = mtp_whole_documents_.data();
    }
  }
  for (int k = 0; k < depths; ++k) {
    MtpDepth::Saved& s = a.mtp[k];
    MtpDepth::shift(s, k + 1, ahead_inputs, ahead_targets, batch, global_seq(seq), ahead_documents);
    if (context_ != nullptr) {
      keep_context_share(s.tokens, batch, seq, context_->size(), context_->rank());
      keep_context_share(s.targets, batch, seq, context_->size(), context_->rank());
    }
    lookup_tokens(sized(s.embedded, local * C, params_.device()), s.tokens.data(), rows, mtp_embed_);
    mtp_module(k).forward(s, config_.recompute ? shared_saved_ : s.block, h_prev, batch, seq, staged, tp_scratch_);
    last_mtp_[k] = head_loss(s.output(), s.head_input, s.logits, s.targets.data(), rows, scale, false);
    if (grad_scale != 0.0f) {
      mtp_totals_.loss_sums[k] += last_mtp_[k];
      mtp_totals_.tokens[k] += static_cast<double>(
          std::count_if(s.targets.begin(), s.targets.end(), [](int32_t t) { return t != kernels::kIgnoreIndex; }));
    }
    h_prev = s.output();
  }
}

void Transformer::mtp_backward(Activations& a, int64_t batch, int64_t seq, const Packing& staged, float* d_main) {
  if (mtp_.empty() || depth_loss_weight() == 0.0) return;  // a zero weight leaves no gradient
  const bool alone = depths_alone();
  const int64_t rows = batch * seq, local = tp_.local_rows(rows), C = config_.d_model;
  const int depths = mtp_depths();
  if (mtp_d_.size() != static_cast<size_t>(depths)) mtp_d_.resize(depths);
  const Device device = params_.device();
  zeroed(mtp_d_[depths - 1], local * C, device);
  for (int k = depths - 1; k >= 0; --k) {
    const MtpDepth::Saved& s = a.mtp[k];
    // d(h_k): what depth k + 1's hnorm passed back (already there), plus its own loss's.
    float* d_output = mtp_d_[k].data();
    kernels::add_in_place(device, d_output, head_grad(s.output(), s.head_input, s.logits, rows, mtp_d_head_, !alone),
                          local * C);
    const float* h_prev = k == 0 ? a.final_norm.out.data() : a.mtp[k - 1].output();
    float* d_prev = k > 0 ? zeroed(mtp_d_[k - 1], local * C, device)
                    : alone ? zeroed(mtp_d_detached_, local * C, device)
                            : d_main;
    const Block::Saved* block_saved = &s.block;
    if (config_.recompute) {
      mtp_module(k).block().forward(shared_saved_, s.block_in.data(), sized(recompute_out_, local * C, device), batch,
                                    seq, staged, tp_scratch_);
      block_saved = &shared_saved_;
    }
    float* d_embedded = sized(mtp_d_embedded_, local * C, device);
    mtp_module(k).backward(d_output, d_prev, d_embedded, h_prev, s, *block_saved, work_, batch, seq, staged,
                           tp_scratch_);
    if (!alone) lookup_tokens_backward(d_embedded, s.tokens.data(), rows, mtp_embed_);
  }
}

}  // namespace loom::model
