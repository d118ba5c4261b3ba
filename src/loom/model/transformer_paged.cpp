// Transformer's batched inference over a paged KV cache (paged.h).
#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/transformer.h"

namespace loom::model {

PagedKVCache Transformer::make_paged_cache(int64_t blocks, int64_t block_size, int64_t state_slots) const {
  check_whole_model("a paged KV cache");
  LOOM_CHECK(blocks > 0 && block_size > 0, "a paged KV cache needs blocks > 0 and block_size > 0");
  LOOM_CHECK(state_slots >= 0, "a paged KV cache needs state_slots >= 0");
  LOOM_CHECK(state_slots > 0 || paged_state_slot_bytes() == 0,
             "a paged KV cache of a model with Mamba-2 layers needs Mamba state slots (one per running sequence)");
  PagedKVCache cache;
  cache.blocks = blocks;
  cache.block_size = block_size;
  cache.state_slots = paged_state_slot_bytes() > 0 ? state_slots : 0;
  cache.layers.resize(blocks_.size());
  for (size_t l = 0; l < blocks_.size(); ++l) {
    PagedLayerCache& layer = cache.layers[l];
    layer.kv_width = blocks_[l].local_kv_width();
    if (layer.kv_width > 0) {
      layer.keys.resize(blocks * block_size * layer.kv_width);
      layer.values.resize(blocks * block_size * layer.kv_width);
    }
    layer.window_width = blocks_[l].local_window_width();
    layer.state_width = blocks_[l].local_state_width();
    if (layer.state_width > 0) {
      zeroed(layer.windows, cache.state_slots * layer.window_width);
      zeroed(layer.states, cache.state_slots * layer.state_width);
    }
  }
  return cache;
}

int64_t Transformer::paged_block_bytes(int64_t block_size) const {
  int64_t bytes = 0;
  for (const Block& b : blocks_) bytes += 2 * block_size * b.local_kv_width() * static_cast<int64_t>(sizeof(float));
  return bytes;
}

int64_t Transformer::paged_state_slot_bytes() const {
  int64_t bytes = 0;
  for (const Block& b : blocks_) {
    bytes += (b.local_window_width() + b.local_state_width()) * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

const float* Transformer::forward_paged(const PagedBatch& batch, PagedKVCache& cache, PagedScratch& s) {
  check_whole_model("inference");
  LOOM_CHECK(params_.device().is_cpu(), "paged inference on " + params_.device().name() + " is not built yet");
  LOOM_CHECK(!tp_.sequence_parallel(), "inference runs without sequence parallelism");
  const int64_t rows = batch.rows(), C = config_.d_model, V = config_.vocab_size;
  LOOM_CHECK(rows > 0, "a paged step needs at least one row");
  for (int32_t p : batch.positions) {
    LOOM_CHECK(p >= 0 && p < config_.max_seq_len, "position " + std::to_string(p) + " is outside model.max_seq_len " +
                                                      std::to_string(config_.max_seq_len));
  }
  check_tokens(batch.tokens.data(), rows);
  float* x = sized(s.x, rows * C);
  if (tp_.single()) {
    kernels::embedding_forward(params_.device(), x, batch.tokens.data(), params_.value(embed_), rows, C, false);
  } else {
    float* partial = tp_.exit_forward_target(x, rows, C, s.tp.partial);
    kernels::embedding_forward_shard(params_.device(), partial, batch.tokens.data(), params_.value(embed_), rows, C,
                                     vocab_first_, vocab_local_);
    std::fill(x, x + rows * C, 0.0f);
    tp_.exit_forward(x, partial, nullptr, rows, C);
  }
  if (positions_ >= 0) {
    kernels::embedding_forward(params_.device(), x, batch.positions.data(), params_.value(positions_), rows, C, true);
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    blocks_[l].forward_paged(x, batch, cache.layers[l], cache.block_size, s.block, s.tp);
  }
  const int64_t n = static_cast<int64_t>(batch.logit_rows.size());
  float* logits = sized(s.logits, std::max<int64_t>(n, 1) * V);
  if (n == 0) return logits;
  float* head_in = sized(s.head_in, n * C);
  for (int64_t i = 0; i < n; ++i) std::copy(x + batch.logit_rows[i] * C, x + (batch.logit_rows[i] + 1) * C, head_in + i * C);
  final_norm_->forward(s.final_norm, head_in, n);
  if (tp_.single()) {
    kernels::linear_forward(params_.device(), logits, s.final_norm.out.data(), params_.value(head_), nullptr, n, C, V);
    return logits;
  }
  float* local = sized(s.local_logits, n * vocab_local_);
  kernels::linear_forward(params_.device(), local, s.final_norm.out.data(), params_.value(head_), nullptr, n, C,
                          vocab_local_);
  tp_.gather_columns(logits, local, n, V);
  return logits;
}

}  // namespace loom::model
