#pragma once
// One step of batched inference over a paged KV cache: the rows of every running sequence
// (prefill chunks and single decode tokens) in one forward. Sequences name their cache blocks in
// a block table; which blocks are free or shared is the engine's business (infer/block_manager.h).
// A hybrid model's Mamba-2 layers keep no keys and values: each sequence owns a slot of a fixed
// pool of recurrent states (convolution window and scan state per layer), named in state_slots;
// a sequence's rows are in position order, and its row at position 0 starts the slot from zero.
#include <cstdint>
#include <vector>

#include "loom/kernels/types.h"
#include "loom/model/buffers.h"

namespace loom::model {

struct PagedBatch {
  std::vector<int32_t> tokens;        // [rows]
  std::vector<int32_t> positions;     // [rows]: the row's position in its sequence
  std::vector<int32_t> sequences;     // [rows]: the row's entry in block_tables
  std::vector<int32_t> block_tables;  // [entries, table_width] block ids
  int64_t table_width = 0;
  std::vector<int32_t> state_slots;   // [entries]: the entry's Mamba state slot (hybrid models)
  std::vector<int64_t> logit_rows;    // rows whose next-token logits are wanted
  // Entries whose rows are prompt tokens (a chunk of one sequence's prompt), whose rows come after
  // every other row; the other entries each decode a sampled token. A GPU attends to prompt rows on
  // tensor cores where the cache is bf16 (kernels::paged_prompt_attention), to decoding rows on
  // CUDA cores in fp32; elsewhere both are paged_attention's.
  std::vector<int32_t> prompt_entries;
  // Speculative decoding's verification rows (a decoding entry's token and its drafts): after
  // row r a Mamba-2 layer copies its sequence's state (window and scan state) into state slot
  // snapshot_slots[r] (-1: none), so that the state after any row kept can be restored. Empty: none.
  std::vector<int32_t> snapshot_slots;
  int64_t rows() const { return static_cast<int64_t>(tokens.size()); }
};

// One multi-token prediction depth's rows of a drafting step (Transformer::draft_paged, speculative
// decoding): depth k (1-based) at position t reads the token k positions ahead of t and the
// previous depth's output at t (depth 1: the main model's output after its final norm), as
// training computes it (multi_token_prediction.h), attending over its own keys and values.
struct DraftBatch {
  int depth = 1;
  // The rows' tokens (each the token `depth` ahead of its position: known, or drafted), positions,
  // table entries, block tables and the rows whose logits (the next drafts) are wanted.
  PagedBatch rows;
  // Per row, where its previous hidden state is: >= 0, that row of the previous source (depth 1:
  // the rows of the last forward_paged; depth k: depth k - 1's rows of the last draft_paged);
  // -1 - kept: depth k - 1's kept state `kept` (retain_rows below).
  std::vector<int32_t> hidden_rows;
  // After the depth: its output at row retain_rows[i] becomes its kept state retain_states[i] (read
  // by depth + 1 at that position in a later step). Only depths below the cache's last. Each
  // state slot s has two kept states per depth, 2 s and 2 s + 1: a step writes one while its next
  // depth reads the other.
  std::vector<int32_t> retain_rows, retain_states;
};

// A batch's per-row metadata where the model's kernels read it: the host arrays themselves on the
// cpu, copies staged to the device per step on a GPU (Transformer::forward_paged makes them).
struct PagedRows {
  const int32_t* positions = nullptr;     // [rows]
  const int32_t* sequences = nullptr;     // [rows]
  const int32_t* block_tables = nullptr;  // [entries, table_width]
  const int32_t* state_slots = nullptr;   // [rows]: the row's Mamba state slot (hybrid models), else null
  // The prompt entries' rows in tiles for kernels::paged_prompt_attention ([prompt_tile_count][2]:
  // first row, rows), after the first decoding_rows rows; prompt_reach: one more than their last
  // position.
  const int32_t* prompt_tiles = nullptr;
  int64_t prompt_tile_count = 0, decoding_rows = 0, prompt_reach = 0;
};

// The keys and values of one attention layer for this rank's kv heads: [blocks, block_size, kv_width]
// elements of kv_dtype (fp32, or bf16: the buffers then hold two per float);
// a Mamba-2 layer's state pool for this rank's heads (always fp32): windows [slots, window_width] (the
// convolution's last conv_kernel - 1 inputs) and states [slots, state_width] (heads x head_dim x state).
struct PagedLayerCache {
  Buffer keys, values;
  int64_t kv_width = 0;
  kernels::KvCacheDtype kv_dtype = kernels::KvCacheDtype::Fp32;
  Buffer windows, states;
  int64_t window_width = 0, state_width = 0;
};

struct PagedKVCache {
  int64_t blocks = 0, block_size = 0;
  // Sample state slots: each running sequence's Mamba states (hybrid models) and the hidden states
  // its drafting depths keep; 0 without either. A hybrid model's Mamba pools hold state_slots x
  // (1 + draft_depths) slots: slot s's, then the snapshots of its verification rows at
  // state_slots + s x draft_depths + i (the engine's Engine::snapshot_slot).
  int64_t state_slots = 0;
  std::vector<PagedLayerCache> layers;  // by layer (empty entries for layers without attention or mixer)
  // Speculative decoding with multi-token prediction: the depths that draft, each with the keys
  // and values of its block (same blocks and tables as the layers'), and the hidden states depths
  // 1 .. draft_depths - 1 keep, two per slot ([2 x state_slots, draft_depths - 1, d_model]).
  int draft_depths = 0;
  std::vector<PagedLayerCache> draft_layers;
  Buffer kept_hidden;
};

}  // namespace loom::model
