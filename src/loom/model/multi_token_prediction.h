#pragma once
// One depth of multi-token prediction (DeepSeek-V3, Nemotron 3; `model.mtp_depths`), as
// Megatron-Core's MultiTokenPredictionLayer computes it. Depth k (1-based) at position t combines
// the previous depth's output h_{k-1} (depth 0: the main model's output after its final norm)
// with the embedding e of the token k positions ahead:
//
//   u = eh_proj([enorm(e) | hnorm(h_{k-1})])      eh_proj: [d_model, 2 d_model], no bias
//   h_k = final_layernorm(block(u))                one attention + feed-forward layer, its own norm
//
// and the model's shared head turns h_k into the logits of token t + 1 + k (the Transformer owns
// the embedding lookup and the head). Names: mtp.layers.{k-1}.{enorm, hnorm, eh_proj,
// final_layernorm}.weight and the block's own under mtp.layers.{k-1}. The norms and eh_proj are
// replicated over tensor-parallel ranks (the block is split as the model's layers are); the norms
// run on this rank's rows (sequence parallel: its share), eh_proj on all rows gathered, so that
// its weight gradient is one GEMM over every row, as on one rank.
#include <optional>
#include <string>
#include <vector>

#include "loom/model/block.h"
#include "loom/model/norm.h"

namespace loom::model {

class MtpDepth {
 public:
  struct Saved {
    Norm::Saved enorm, hnorm;
    Buffer embedded;  // [local, C]: the shifted tokens' embeddings (the Transformer fills it)
    Buffer combined;  // [local, 2C]: enorm(e) | hnorm(h_{k-1})
    Buffer combined_all;  // sequence parallel: every rank's rows of it (eh_proj's GEMM input)
    Buffer block_in;   // [local, C]: eh_proj's output
    Buffer block_out;  // [local, C]: the block's output
    Block::Saved block;  // unused with recompute (the model's shared one)
    Norm::Saved final_norm;  // its output is h_k
    // The shared head applied to h_k: its input (all rows, sequence parallel) and logits.
    Buffer head_input, logits;
    std::vector<int32_t> tokens, targets;  // [batch, seq]: the token k ahead, and the one 1 + k ahead
    const float* output() const { return final_norm.out.data(); }  // h_k, [local, C]
    int64_t bytes() const;
  };

  // `depth`: 1-based, the depth whose names (mtp.layers.{depth-1}) the weights take; with
  // model.mtp_use_repeated_layer one MtpDepth (depth 1) serves every depth. The block is attention
  // plus the model's feed-forward (a MoE when model.moe_experts > 0, else a dense MLP of
  // model.ffn_size).
  MtpDepth(ParameterStore& store, const TensorParallel& tp, int depth, const config::ModelConfig& config,
           const kernels::RopeTable* rope, ExpertLayout experts);

  // The token ids and targets of depth k (1-based) for a micro-batch: tokens[t] = inputs[t + k] and
  // targets[t] = targets_in[t + k] where t + k is in the row (and, with documents, in t's
  // document); elsewhere token 0 and an ignored target (a causal block never lets those rows
  // reach an unmasked one).
  static void shift(Saved& saved, int k, const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                    const int32_t* documents);
  // saved.embedded must hold the embeddings of saved.tokens; writes h_k (saved.output()).
  // `block_saved`: saved.block, or the model's shared one under recompute.
  void forward(Saved& saved, Block::Saved& block_saved, const float* h_prev, int64_t batch, int64_t seq,
               const Packing& packing, ParallelScratch& scratch) const;
  // d_output holds d(loss)/d(h_k). Adds d(loss)/d(h_{k-1}) into d_prev and writes d(loss)/d(e)
  // into d_embedded ([local, C]); parameter gradients go to the store.
  void backward(const float* d_output, float* d_prev, float* d_embedded, const float* h_prev, const Saved& saved,
                const Block::Saved& block_saved, Workspace& work, int64_t batch, int64_t seq, const Packing& packing,
                ParallelScratch& scratch) const;

  // Speculative decoding's drafting (Transformer::draft_paged): the depth over `batch`'s rows (no
  // sequence parallelism), its block attending over its own keys and values in `cache`.
  // saved.embedded holds the rows' tokens' embeddings; writes h_k (saved.output()).
  void forward_paged(Saved& saved, const float* h_prev, const PagedBatch& batch, const PagedRows& on_device,
                     PagedLayerCache& cache, int64_t block_size, Block::Saved& block_scratch,
                     ParallelScratch& scratch) const;

  Block& block() { return block_; }
  const Block& block() const { return block_; }

 private:
  // [enorm(e) | hnorm(h_prev)] of `rows` rows into saved.combined (returned).
  const float* combine(Saved& saved, const float* h_prev, int64_t rows) const;

  const TensorParallel* tp_;
  ParameterStore* store_;
  int d_model_;
  Norm enorm_, hnorm_;
  int eh_proj_ = -1;
  Block block_;
  Norm final_norm_;
  mutable Buffer d_block_, d_combined_, d_half_, out_all_, d_out_all_;
};

// The layer spec of an MTP block (attention and the model's feed-forward).
LayerSpec mtp_block_spec(const config::ModelConfig& config);

}  // namespace loom::model
