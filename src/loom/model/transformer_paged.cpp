// Transformer's batched inference over a paged KV cache (paged.h).
#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/model/transformer.h"

namespace loom::model {

namespace {
// A layer's cache: keys and values of `block`'s attention in `blocks` blocks, its Mamba pool in `slots` slots.
PagedLayerCache layer_cache(const Block& block, int64_t blocks, int64_t block_size, int64_t slots,
                            kernels::KvCacheDtype kv_dtype, Device device) {
  PagedLayerCache layer;
  layer.kv_width = block.local_kv_width();
  layer.kv_dtype = kv_dtype;
  if (layer.kv_width > 0) {
    const int64_t bytes = blocks * block_size * layer.kv_width * kernels::kv_cache_element_bytes(kv_dtype);
    sized_bytes(layer.keys, bytes, device);
    sized_bytes(layer.values, bytes, device);
  }
  layer.window_width = block.local_window_width();
  layer.state_width = block.local_state_width();
  if (layer.state_width > 0) {
    zeroed(layer.windows, slots * layer.window_width, device);
    zeroed(layer.states, slots * layer.state_width, device);
  }
  return layer;
}
}  // namespace

PagedKVCache Transformer::make_paged_cache(int64_t blocks, int64_t block_size, int64_t state_slots,
                                           kernels::KvCacheDtype kv_dtype, int draft_depths) const {
  check_whole_model("a paged KV cache");
  LOOM_CHECK(blocks > 0 && block_size > 0, "a paged KV cache needs blocks > 0 and block_size > 0");
  LOOM_CHECK(state_slots >= 0, "a paged KV cache needs state_slots >= 0");
  LOOM_CHECK(draft_depths >= 0 && draft_depths <= mtp_depths(),
             "speculative decoding drafts with " + std::to_string(draft_depths) + " multi-token prediction depths; " +
                 "the model has " + std::to_string(mtp_depths()) + " (model.mtp_depths)");
  LOOM_CHECK(state_slots > 0 || paged_state_slot_bytes(draft_depths) == 0,
             "a paged KV cache of a model with Mamba-2 layers, or drafting with several depths, needs state slots "
             "(one per running sequence)");
  PagedKVCache cache;
  cache.blocks = blocks;
  cache.block_size = block_size;
  cache.state_slots = paged_state_slot_bytes(draft_depths) > 0 ? state_slots : 0;
  cache.draft_depths = draft_depths;
  const Device device = params_.device();
  // A hybrid model's Mamba pools: the sample slots, then their verification rows' snapshots.
  const int64_t mamba_slots = cache.state_slots * (1 + draft_depths);
  for (const Block& block : blocks_) {
    cache.layers.push_back(layer_cache(block, blocks, block_size, mamba_slots, kv_dtype, device));
  }
  for (int k = 0; k < draft_depths; ++k) {
    cache.draft_layers.push_back(
        layer_cache(mtp_module(k).block(), blocks, block_size, 0, kv_dtype, device));
  }
  if (draft_depths > 1) zeroed(cache.kept_hidden, 2 * cache.state_slots * (draft_depths - 1) * config_.d_model, device);
  return cache;
}

int64_t Transformer::paged_block_bytes(int64_t block_size, kernels::KvCacheDtype kv_dtype, int draft_depths) const {
  int64_t bytes = 0;
  const int64_t element = kernels::kv_cache_element_bytes(kv_dtype);
  for (const Block& b : blocks_) bytes += 2 * block_size * b.local_kv_width() * element;
  for (int k = 0; k < draft_depths && !mtp_.empty(); ++k) {
    bytes += 2 * block_size * mtp_module(k).block().local_kv_width() * element;
  }
  return bytes;
}

int64_t Transformer::paged_state_slot_bytes(int draft_depths) const {
  int64_t mamba = 0;
  for (const Block& b : blocks_) mamba += b.local_window_width() + b.local_state_width();
  const int64_t kept = draft_depths > 1 ? 2 * (draft_depths - 1) * config_.d_model : 0;
  return (mamba * (1 + draft_depths) + kept) * static_cast<int64_t>(sizeof(float));
}

void Transformer::head_logits(float* logits, const float* normed, int64_t rows) const {
  const int64_t C = config_.d_model;
  if (head_precision_) {
    head_precision_->forward(logits, normed, params_.value(head_), nullptr, rows, C, vocab_local_);
  } else {
    kernels::linear_forward(params_.device(), logits, normed, params_.value(head_), nullptr, rows, C, vocab_local_);
  }
}

namespace {

// What the attention kernels will read, checked on the host: each row's table entry, and the ids
// of the blocks holding its keys (positions 0 .. its own), inside the cache. A bad index would
// read outside the pools: on a GPU an illegal address, which ends the whole CUDA context.
void check_block_tables(const PagedBatch& batch, const PagedKVCache& cache) {
  if (cache.blocks == 0 || cache.block_size <= 0) return;  // no attention layer reads them
  const int64_t width = batch.table_width;
  LOOM_CHECK(width > 0 && static_cast<int64_t>(batch.block_tables.size()) % width == 0,
             "paged step: block_tables holds " + std::to_string(batch.block_tables.size()) +
                 " ids, not whole rows of table_width " + std::to_string(width));
  const int64_t entries = static_cast<int64_t>(batch.block_tables.size()) / width;
  LOOM_CHECK(batch.sequences.size() == batch.tokens.size(), "paged step: one sequence entry per row");
  for (int64_t r = 0; r < batch.rows(); ++r) {
    const int64_t entry = batch.sequences[static_cast<size_t>(r)];
    const int64_t last = batch.positions[static_cast<size_t>(r)] / cache.block_size;
    LOOM_CHECK(entry >= 0 && entry < entries, "paged step: row " + std::to_string(r) + " names table entry " +
                                                  std::to_string(entry) + " of " + std::to_string(entries));
    LOOM_CHECK(last < width, "paged step: row " + std::to_string(r) + " at position " +
                                 std::to_string(batch.positions[static_cast<size_t>(r)]) + " needs block " +
                                 std::to_string(last) + " of a table " + std::to_string(width) + " wide");
    for (int64_t b = 0; b <= last; ++b) {
      const int32_t id = batch.block_tables[static_cast<size_t>(entry * width + b)];
      LOOM_CHECK(id >= 0 && id < cache.blocks, "paged step: table entry " + std::to_string(entry) + " names block " +
                                                   std::to_string(id) + " of a cache of " +
                                                   std::to_string(cache.blocks));
    }
  }
}

// The prompt entries' rows cut into tiles of up to kPromptTileRows rows of one entry (first row,
// rows), the tiles reaching furthest first (the grid's last blocks are the short ones), and one
// more than their last position in `reach`; returns the rows before them, which decode. A decoding
// row after a prompt row is an error.
int64_t prompt_tiles(const PagedBatch& batch, std::vector<int32_t>& tiles, int64_t& reach) {
  tiles.clear();
  reach = 0;
  const int64_t rows = batch.rows();
  if (batch.prompt_entries.empty()) return rows;  // a step of decoding rows only
  const int64_t entries = static_cast<int64_t>(batch.block_tables.size()) / std::max<int64_t>(batch.table_width, 1);
  std::vector<bool> prompt(static_cast<size_t>(entries), false);
  for (int32_t entry : batch.prompt_entries) {
    LOOM_CHECK(entry >= 0 && entry < entries, "paged step: prompt entry " + std::to_string(entry) + " of " +
                                                  std::to_string(entries) + " table entries");
    prompt[static_cast<size_t>(entry)] = true;
  }
  auto is_prompt = [&](int64_t r) {
    const int32_t entry = batch.sequences[static_cast<size_t>(r)];
    LOOM_CHECK(entry >= 0 && entry < entries, "paged step: row " + std::to_string(r) + " names table entry " +
                                                  std::to_string(entry) + " of " + std::to_string(entries));
    return prompt[static_cast<size_t>(entry)];
  };
  int64_t decoding = 0;
  while (decoding < rows && !is_prompt(decoding)) ++decoding;
  struct Tile {
    int32_t last, first, rows;  // last: its last row's position
  };
  std::vector<Tile> cut;
  for (int64_t r = decoding; r < rows;) {
    LOOM_CHECK(is_prompt(r), "paged step: row " + std::to_string(r) +
                                 " decodes after the prompt rows that start at row " + std::to_string(decoding) +
                                 " (prompt rows come last)");
    int64_t end = r + 1;
    while (end < rows && end - r < kernels::kPromptTileRows &&
           batch.sequences[static_cast<size_t>(end)] == batch.sequences[static_cast<size_t>(r)]) {
      // A tile's keys up to its last position must all be written: its rows are one chunk.
      LOOM_CHECK(batch.positions[static_cast<size_t>(end)] == batch.positions[static_cast<size_t>(end - 1)] + 1,
                 "paged step: prompt row " + std::to_string(end) + " at position " +
                     std::to_string(batch.positions[static_cast<size_t>(end)]) + " follows position " +
                     std::to_string(batch.positions[static_cast<size_t>(end - 1)]) +
                     " of its sequence (a prompt chunk's positions are consecutive)");
      ++end;
    }
    cut.push_back(
        {batch.positions[static_cast<size_t>(end - 1)], static_cast<int32_t>(r), static_cast<int32_t>(end - r)});
    r = end;
  }
  std::stable_sort(cut.begin(), cut.end(), [](const Tile& a, const Tile& b) { return a.last > b.last; });
  for (const Tile& t : cut) tiles.insert(tiles.end(), {t.first, t.rows});
  if (!cut.empty()) reach = static_cast<int64_t>(cut.front().last) + 1;
  return decoding;
}

}  // namespace

PagedRows Transformer::stage_paged_rows(const PagedBatch& batch, const PagedKVCache& cache, PagedScratch& s) {
  const int64_t rows = batch.rows();
  LOOM_CHECK(rows > 0, "a paged step needs at least one row");
  LOOM_CHECK(batch.positions.size() == batch.tokens.size(), "paged step: one position per row");
  for (int32_t p : batch.positions) {
    LOOM_CHECK(p >= 0 && p < config_.max_seq_len, "position " + std::to_string(p) + " is outside model.max_seq_len " +
                                                      std::to_string(config_.max_seq_len));
  }
  check_block_tables(batch, cache);
  const Device device = params_.device();
  PagedRows on_device{
      s.positions.stage(device, batch.positions.data(), rows), s.sequences.stage(device, batch.sequences.data(), rows),
      s.block_tables.stage(device, batch.block_tables.data(), static_cast<int64_t>(batch.block_tables.size()))};
  on_device.decoding_rows = prompt_tiles(batch, s.tiles, on_device.prompt_reach);
  on_device.prompt_tile_count = static_cast<int64_t>(s.tiles.size() / 2);
  on_device.prompt_tiles = s.prompt_tiles.stage(device, s.tiles.data(), static_cast<int64_t>(s.tiles.size()));
  if (!batch.state_slots.empty()) {  // checked where the Mamba layers read them (-1: no entry)
    const auto entries = static_cast<int64_t>(batch.state_slots.size());
    s.row_slots.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t entry = batch.sequences[static_cast<size_t>(r)];
      s.row_slots[static_cast<size_t>(r)] =
          entry >= 0 && entry < entries ? batch.state_slots[static_cast<size_t>(entry)] : -1;
    }
    on_device.state_slots = s.state_slots.stage(device, s.row_slots.data(), rows);
  }
  return on_device;
}

const float* Transformer::paged_logits(const float* x, const std::vector<int64_t>& rows, bool normed,
                                       PagedScratch& s) {
  const int64_t n = static_cast<int64_t>(rows.size()), C = config_.d_model, V = config_.vocab_size;
  const Device device = params_.device();
  float* logits = sized(s.logits, std::max<int64_t>(n, 1) * V, device);
  if (n == 0) return logits;
  s.logit_rows.assign(rows.begin(), rows.end());
  float* head_in = sized(s.head_in, n * C, device);
  kernels::gather_rows(device, head_in, x, s.logit_indices.stage(device, s.logit_rows.data(), n), nullptr, n, C);
  if (!normed) {  // the rows alone through the final norm (a row's norm is its own)
    final_norm_->forward(s.final_norm, head_in, n);
    head_in = s.final_norm.out.data();
  }
  float* out = tp_.single() ? logits : sized(s.local_logits, n * vocab_local_, device);
  head_logits(out, head_in, n);
  if (!tp_.single()) tp_.gather_columns(logits, out, n, V);
  return logits;
}

const float* Transformer::forward_paged(const PagedBatch& batch, PagedKVCache& cache, PagedScratch& s) {
  check_whole_model("inference");
  LOOM_CHECK(!tp_.sequence_parallel(), "inference runs without sequence parallelism");
  const int64_t rows = batch.rows(), C = config_.d_model;
  const PagedRows on_device = stage_paged_rows(batch, cache, s);
  const Device device = params_.device();
  float* x = sized(s.x, rows * C, device);
  lookup_tokens(x, batch.tokens.data(), rows, embed_);
  if (positions_ >= 0) {
    kernels::embedding_forward(device, x, on_device.positions, params_.value(positions_), rows, C, true);
  }
  for (size_t l = 0; l < blocks_.size(); ++l) {
    trace::Range range("block", static_cast<int64_t>(l), "paged forward");
    blocks_[l].forward_paged(x, batch, on_device, cache.layers[l], cache.block_size, s.block, s.tp);
  }
  if (cache.draft_depths == 0) return paged_logits(x, batch.logit_rows, false, s);
  // Drafting reads every row's output after the final norm (h_0 of multi-token prediction).
  final_norm_->forward(s.hidden, x, rows);
  s.hidden_rows = rows;
  return paged_logits(s.hidden.out.data(), batch.logit_rows, true, s);
}

const float* Transformer::draft_paged(const DraftBatch& draft, PagedKVCache& cache, PagedScratch& s) {
  check_whole_model("drafting");
  const int k = draft.depth, depths = cache.draft_depths;
  LOOM_CHECK(k >= 1 && k <= depths, "drafting depth " + std::to_string(k) + " of a cache that drafts with " +
                                        std::to_string(depths) + " depths");
  const PagedBatch& batch = draft.rows;
  const int64_t rows = batch.rows(), C = config_.d_model;
  LOOM_CHECK(draft.hidden_rows.size() == batch.tokens.size(), "drafting: one hidden state source per row");
  LOOM_CHECK(draft.retain_rows.size() == draft.retain_states.size() && (draft.retain_rows.empty() || k < depths),
             "drafting: retained rows need their kept states, and only depths below the last keep any");
  const PagedRows on_device = stage_paged_rows(batch, cache, s);
  const Device device = params_.device();
  if (s.draft.size() < static_cast<size_t>(depths)) {
    s.draft.resize(static_cast<size_t>(depths));
    s.draft_rows.assign(static_cast<size_t>(depths), 0);
  }
  // The previous hidden state of each row: a row of the previous source, or a kept state.
  const float* source = k == 1 ? s.hidden.out.data() : s.draft[static_cast<size_t>(k - 2)].output();
  const int64_t source_rows = k == 1 ? s.hidden_rows : s.draft_rows[static_cast<size_t>(k - 2)];
  const int64_t kept_states = 2 * cache.state_slots;
  auto kept_at = [&](int64_t state, int depth) {  // depth's kept state `state`
    return cache.kept_hidden.data() + (state * (depths - 1) + (depth - 1)) * C;
  };
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t from = draft.hidden_rows[static_cast<size_t>(r)];
    LOOM_CHECK(from < source_rows && (from >= 0 || (k > 1 && -1 - static_cast<int64_t>(from) < kept_states)),
               "drafting depth " + std::to_string(k) + ": row " + std::to_string(r) + " reads hidden state " +
                   std::to_string(from) + " of " + std::to_string(source_rows) + " rows (or a kept one of " +
                   std::to_string(kept_states) + " at depth 2 and deeper)");
  }
  float* h_prev = sized(s.draft_prev, rows * C, device);
  kernels::gather_rows(device, h_prev, source, s.hidden_indices.stage(device, draft.hidden_rows.data(), rows), nullptr,
                       rows, C);
  for (int64_t r = 0; r < rows; ++r) {  // gathered as zeros; the kept states copied in
    const int32_t from = draft.hidden_rows[static_cast<size_t>(r)];
    if (from < 0) copy_on_device(device, h_prev + r * C, kept_at(-1 - static_cast<int64_t>(from), k - 1), C);
  }
  MtpDepth::Saved& saved = s.draft[static_cast<size_t>(k - 1)];
  lookup_tokens(sized(saved.embedded, rows * C, device), batch.tokens.data(), rows, mtp_embed_);
  trace::Range range("draft depth", k, "paged forward");
  mtp_module(k - 1).forward_paged(saved, h_prev, batch, on_device, cache.draft_layers[static_cast<size_t>(k - 1)],
                                  cache.block_size, s.block, s.tp);
  s.draft_rows[static_cast<size_t>(k - 1)] = rows;
  for (size_t i = 0; i < draft.retain_rows.size(); ++i) {
    const int64_t row = draft.retain_rows[i], state = draft.retain_states[i];
    LOOM_CHECK(row >= 0 && row < rows && state >= 0 && state < kept_states,
               "drafting: row " + std::to_string(row) + " of " + std::to_string(rows) + " kept as state " +
                   std::to_string(state) + " of " + std::to_string(kept_states));
    copy_on_device(device, kept_at(state, k), saved.output() + row * C, C);
  }
  return paged_logits(saved.output(), batch.logit_rows, true, s);
}

}  // namespace loom::model
