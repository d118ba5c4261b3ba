#pragma once
// Decoder-only transformer (GPT-2 and Llama families, heterogeneous layers) with explicit
// forward and backward. Activations live in buffers owned here; with `model.recompute` each
// block keeps only its input and recomputes the rest in backward (activation checkpointing).
#include <memory>
#include <optional>
#include <vector>

#include "loom/kernels/types.h"
#include "loom/model/block.h"
#include "loom/model/layer_spec.h"
#include "loom/model/linear_precision.h"
#include "loom/model/multi_token_prediction.h"
#include "loom/model/norm.h"
#include "loom/model/packing.h"
#include "loom/model/paged.h"
#include "loom/model/parameter_hooks.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"
#include "loom/model/tensor_parallel_grads.h"
#include "loom/model/token_objective.h"
#include "loom/config/run_config.h"

namespace loom::model {

// Per-sequence state for generation with a KV cache.
struct DecodeState {
  std::vector<KVCache> caches;  // one per layer
  int64_t length = 0;           // positions already in the caches
  Block::Saved scratch;
  ParallelScratch tp_scratch;
  Norm::Saved final_norm;
  Buffer x, logits;                // on the model's device
  std::vector<float> host_logits;  // the logits copied to the host when that is a GPU
};

// Scratch of a paged forward (forward_paged), reused across steps; on a GPU the step's metadata
// is staged to the device here.
struct PagedScratch {
  Block::Saved block;
  ParallelScratch tp;
  Norm::Saved final_norm;
  // Speculative decoding: the last forward's rows after the final norm (a cache that drafts) and
  // their count; by depth, the drafting depths' scratch (their output: h_k) and row counts; the
  // previous hidden states a depth reads.
  Norm::Saved hidden;
  int64_t hidden_rows = 0;
  std::vector<MtpDepth::Saved> draft;
  std::vector<int64_t> draft_rows;
  Buffer draft_prev;
  StagedTokens hidden_indices;
  Buffer x, head_in, local_logits, logits;
  std::vector<int32_t> logit_rows;  // the batch's logit rows as gather indices
  std::vector<int32_t> row_slots;   // each row's Mamba state slot (hybrid models)
  std::vector<int32_t> tiles;       // the prompt rows' tiles (PagedRows::prompt_tiles)
  StagedTokens positions, sequences, block_tables, logit_indices, state_slots, prompt_tiles;
};

// The layers a pipeline rank holds for one of its model chunks (virtual stages): [first, last).
struct LayerRange {
  int first = 0, last = 0;
  bool operator==(const LayerRange&) const = default;
};

// What one micro-batch leaves between a chunk's forward and its backward. forward_backward
// uses the model's own; pipeline schedules keep one per micro-batch and chunk in flight.
struct Activations {
  std::vector<Buffer> residual;     // by global layer: the stream before layer l, and after the last
  std::vector<Block::Saved> saved;  // by global layer (empty with recompute: blocks recompute theirs)
  Norm::Saved final_norm;
  // the head's output; after the loss, grad_scale * d(loss)/d(logits) (bf16_logits: 2-byte elements)
  Buffer logits;
  Buffer head_input;  // the head's input over all rows (sequence parallel)
  Buffer d_x;         // a backward's running gradient of the residual stream
  std::vector<int32_t> position_ids;
  std::vector<MtpDepth::Saved> mtp;  // by depth: multi-token prediction (the last chunk)
  int64_t bytes() const;
};

// Multi-token prediction's losses over the micro-batches trained since they were last taken.
struct MtpTotals {
  std::vector<double> loss_sums;  // by depth: summed token losses
  std::vector<double> tokens;     // by depth: the target tokens they cover
};

class Transformer {
 public:
  // config.vocab_size must be resolved (> 0). Parameters are allocated, not initialised. With a
  // tensor-parallel group each rank holds its shard of every split parameter (heads, ffn
  // features, vocabulary rows) and the model computes the same function as on one rank; a layer
  // whose sizes cannot be split is an Error naming it.
  // `precision`: the recipe of the linear layers' and the head's GEMMs (default fp32).
  // `chunks`: the layers this pipeline rank holds, one range per model chunk in stage order
  // (empty: every layer). The rank holding layer 0 holds the embeddings, the one holding the
  // last layer the final norm and head; with tied embeddings and both on different ranks, the
  // last one holds a copy of the embedding (same name, same initial values; its gradient is
  // summed with the first's over the embedding group, and it is left out of the norm).
  // `experts`: this rank's place among the expert-parallel ranks (it registers its MoE layers'
  // experts only; an ExpertComm from set_expert_comm moves tokens between them).
  // `device`: where parameters, gradients and activations live and the kernels run. Token-level
  // inputs stay host arrays in every call (checked there, uploaded right before their use). On a
  // GPU the dense layers of one rank train in fp32; what is not built there yet (MoE, Mamba-2,
  // multi-token prediction, tensor parallelism, precision recipes, `decode`, token objectives)
  // is an Error naming the setting.
  explicit Transformer(const config::ModelConfig& config, TensorParallel tp = {}, PrecisionPolicy precision = {},
                       std::vector<LayerRange> chunks = {}, ExpertLayout experts = {}, Device device = Device::cpu());

  // Every parameter the model of `config` registers on this rank (names, shapes, shard specs,
  // weight decay, offsets), in registration order: the modules are built on a shapes-only store,
  // so nothing is allocated for the model, however large. The one source of the parameter list.
  // `experts`: the rank's place in its expert-parallel group (it registers its share of the experts).
  static std::vector<Parameter> parameter_list(const config::ModelConfig& config, TensorParallel tp = {},
                                               std::vector<LayerRange> chunks = {}, ExpertLayout experts = {});

  void initialize(uint64_t seed) { params_.initialize(seed); }

  // The MoE layers this rank holds, in layer order.
  std::vector<MoeLayer*> moe_layers();
  std::vector<const MoeLayer*> moe_layers() const;
  // Installs the expert-parallel exchange on every MoE layer (null: experts all local).
  void set_expert_comm(ExpertComm* comm);
  // The balancing losses' gradient scale (MoeLayer::set_aux_scale) on every MoE layer.
  void set_aux_loss_scale(float scale);
  ParameterStore& params() { return params_; }
  const ParameterStore& params() const { return params_; }
  const config::ModelConfig& config() const { return config_; }
  const std::vector<LayerSpec>& layers() const { return specs_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The linear layers' precision state (FP8 amax histories), for the trainer and checkpoints.
  PrecisionContext& precision() { return *precision_; }

  // The model chunks this rank holds (one when there is no pipeline).
  const std::vector<LayerRange>& chunks() const { return chunks_; }
  bool holds_embedding() const { return embed_ >= 0 && chunks_.front().first == 0; }
  bool holds_head() const { return chunks_.back().last == config_.layers; }
  // The last pipeline stage's copy of the embedding (-1: none): a tied head's, or the one
  // multi-token prediction looks tokens up in when the first stage is another rank.
  int embedding_copy() const { return embedding_copy_; }

  // Multi-token prediction (model.mtp_depths, on the rank holding the head). The training loss
  // is the main loss plus mtp_loss_weight / depths times the depths' summed losses; forward_chunk
  // returns the main loss only. The summed losses of training micro-batches (grad_scale != 0)
  // are accumulated here until taken.
  int mtp_depths() const { return mtp_.empty() ? 0 : config_.mtp_depths; }
  MtpTotals take_mtp_totals();
  // Each depth's summed token loss in the last forward (training or not).
  const std::vector<double>& last_mtp_loss_sums() const { return last_mtp_; }

  // Forward and backward on one micro-batch (the model must hold every layer): inputs/targets are [batch, seq] (the same on every
  // tensor-parallel rank); targets equal to kIgnoreIndex are masked. Gradients of grad_scale * (sum of token losses) are *added* into
  // params().grads(). Returns the sum of token losses. `packing`: the micro-batch's documents and
  // positions ([batch, seq] each, packing.h); default: plain rows.
  double forward_backward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                          float grad_scale, const Packing& packing = {});
  // Sum of token losses without gradients (evaluation).
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                      const Packing& packing = {});

  // Pipeline stages run one chunk of one micro-batch at a time, each with its own Activations.
  // Activations exchanged between stages are this rank's rows of the residual stream:
  // stage_rows(batch * seq) x d_model floats.
  int64_t stage_rows(int64_t rows) const { return tp_.local_rows(rows); }
  // Where the previous stage's output is received before forward_chunk (not for chunk 0 of
  // the model, which embeds `inputs`).
  float* chunk_input(Activations& a, int chunk, int64_t rows);
  // A chunk's forward. The model's first chunk embeds `inputs`; the last computes the loss of
  // `targets` and returns its sum (grad_scale as in forward_backward, 0: no gradient kept); any
  // other returns 0 and leaves its output in chunk_output.
  // Every chunk of a micro-batch takes the same `packing` (a batch input, like `inputs`).
  double forward_chunk(Activations& a, int chunk, const int32_t* inputs, const int32_t* targets, int64_t batch,
                       int64_t seq, float grad_scale, const Packing& packing = {});
  const float* chunk_output(const Activations& a, int chunk) const;
  // Where the next stage's gradient of chunk_output is received before backward_chunk (not for
  // the model's last chunk, which starts from its loss).
  float* chunk_output_grad(Activations& a, int64_t rows);
  // A chunk's backward: adds its parameters' gradients; afterwards chunk_input_grad holds the
  // gradient of the chunk's input (for the previous stage; the model's first chunk instead
  // reaches the embeddings and needs `inputs`).
  void backward_chunk(Activations& a, int chunk, const int32_t* inputs, int64_t batch, int64_t seq,
                      const Packing& packing = {});
  const float* chunk_input_grad(const Activations& a) const { return a.d_x.data(); }

  // Appends `count` tokens to the sequence and returns the logits [vocab] after the last one, in
  // host memory whatever the model's device (one rank: parallel.tp = 1).
  const float* decode(DecodeState& state, const int32_t* tokens, int64_t count);

  // A paged KV cache of `blocks` blocks of `block_size` positions for this rank's kv heads, its
  // keys and values of `kv_dtype`, with `state_slots` Mamba state slots (hybrid models; zeroed),
  // and the bytes one block and one state slot take over all layers (for a memory budget; a slot
  // is 0 bytes without Mamba layers).
  // With `draft_depths` (1 .. model.mtp_depths) the first depths of multi-token prediction draft
  // tokens for speculative decoding (draft_paged): their blocks' keys and values, and per slot
  // the Mamba snapshots and hidden states they keep, are counted and made too.
  PagedKVCache make_paged_cache(int64_t blocks, int64_t block_size, int64_t state_slots = 0,
                                kernels::KvCacheDtype kv_dtype = kernels::KvCacheDtype::Fp32,
                                int draft_depths = 0) const;
  int64_t paged_block_bytes(int64_t block_size, kernels::KvCacheDtype kv_dtype = kernels::KvCacheDtype::Fp32,
                            int draft_depths = 0) const;
  int64_t paged_state_slot_bytes(int draft_depths = 0) const;
  // One batched inference step over every row of `batch` (any tp; every rank passes the same
  // batch): returns the logits [logit_rows, vocab] (the whole vocabulary on every rank), on the
  // model's device. The cache must live there too (make_paged_cache puts it there).
  // With a cache that drafts, the step's rows after the final norm stay in `scratch` for depth 1.
  const float* forward_paged(const PagedBatch& batch, PagedKVCache& cache, PagedScratch& scratch);
  // One depth of speculative decoding's drafting over `draft`'s rows (after the forward_paged
  // whose rows depth 1 reads, and depth k - 1's draft_paged): returns the logits of its logit
  // rows (the drafts' distributions), as forward_paged does.
  const float* draft_paged(const DraftBatch& draft, PagedKVCache& cache, PagedScratch& scratch);
  // Context parallelism (context_attention.h): this rank's inputs hold its 2 of each sequence's
  // 2 x cp chunks, and attention spans the group through `context`; null (the default): whole
  // sequences. Positions (RoPE, learned) follow the tokens' global places.
  void set_context_attention(ContextAttention* context);
  // Tokens per sequence of the whole group: `seq` local ones times the context-parallel ranks.
  int64_t global_seq(int64_t seq) const { return context_ != nullptr ? seq * context_->size() : seq; }

  // The head's objective in place of cross-entropy for the next passes (null: cross-entropy).
  // Passes return the sum of its row losses; with grad_scale, gradients of grad_scale * that sum.
  void set_token_objective(TokenObjective* objective) { objective_ = objective; }

  // Parallel wrappers observe each unit (see parameter_hooks.h); null = none.
  void set_hooks(ParameterHooks* hooks) { hooks_ = hooks; }
  int units() const { return config_.layers + 2; }
  // Parameter ids a unit reads (the head unit includes the embedding when tied).
  const std::vector<int>& unit_parameters(int unit) const { return unit_params_.at(unit); }
  // For each parameter: the unit whose backward completes its gradient (the lowest unit using it).
  std::vector<int> gradient_ready_unit() const;

  // Training FLOPs per token at sequence length `seq` (3x forward GEMMs incl. attention's).
  double training_flops_per_token(int64_t seq) const;
  // Bytes of activations this rank holds between forward and backward for (batch, seq).
  int64_t activation_bytes() const;

 private:
  Transformer(const config::ModelConfig& config, TensorParallel tp, PrecisionPolicy precision,
              std::vector<LayerRange> chunks, ParameterStore::Allocation allocation, ExpertLayout experts,
              Device device);
  // The micro-batch's packing where the kernels read it (staged_tokens below).
  Packing staged_packing(const Packing& packing, int64_t rows);
  void check_tokens(const int32_t* tokens, int64_t rows) const;
  void check_whole_model(const std::string& what) const;
  void check_packing(const Packing& packing, int64_t rows) const;
  void embed(float* out, const int32_t* tokens, int64_t batch, int64_t seq, int64_t position_start,
             const int32_t* positions, std::vector<int32_t>& position_ids);
  void embed_backward(const float* d_x, const int32_t* tokens, int64_t rows, const std::vector<int32_t>& position_ids);
  // Whether the head keeps its logits in bf16: on a GPU under a bf16 head (the bf16, FP8 and MX
  // recipes), with the whole vocabulary on this rank and the plain cross-entropy (no token
  // objective). The head GEMM's bf16 result goes to kernels::softmax_cross_entropy_bf16 as it is,
  // and its bf16 gradient to the head's two backward GEMMs (LinearPrecision's DeviceTensors): no
  // widening pass, no cast of the gradient, half the logits' bytes. The
  // values are those of the fp32 path (logits already rounded to bf16, the gradient cast to bf16
  // for its GEMMs), so the results are the same.
  bool bf16_logits() const;
  // Sum of token losses; logits holds grad_scale * d(loss)/d(logits) after it (when non-zero).
  // `model_rows`: the main model's rows, which go through objective_ where one is set (a depth's
  // rows are always cross-entropy).
  double cross_entropy(float* logits, const int32_t* targets, int64_t rows, float grad_scale, bool model_rows);
  // The same with objective_: log-probabilities, the objective's row gradients, their logits' gradient.
  double objective_loss(float* logits, const int32_t* targets, int64_t rows, float grad_scale);
  double head_forward(Activations& a, const int32_t* targets, int64_t rows, float grad_scale);
  // a.d_x = the gradient of the last block's output (the head's, and multi-token prediction's
  // depths', through the final norm); in bf16 too, or its amax taken, where for_reader.reader
  // takes it (ResidualGradForReader). `staged`: the packing where the blocks read it
  // (staged_packing).
  void head_backward(Activations& a, int64_t batch, int64_t seq, const Packing& staged,
                     ResidualGradForReader& for_reader);
  // The head and loss on `normed` (this rank's rows of a final norm's output: the model's, or a
  // depth's, as cross_entropy's `model_rows` says); head_grad writes d(loss)/d(normed) into `out`
  // ([local, C], logits holding the loss's gradient) and returns it, adding the head weight's
  // gradient unless the loss is one only the depths learn from (depths_alone()).
  double head_loss(const float* normed, Buffer& head_input, Buffer& logits, const int32_t* targets, int64_t rows,
                   float grad_scale, bool model_rows);
  float* head_grad(const float* normed, const Buffer& head_input, const Buffer& logits, int64_t rows, Buffer& out,
                   bool weight_gradient);
  // The token lookup of embedding table `table` (vocabulary-parallel over tp) and its backward.
  void lookup_tokens(float* out, const int32_t* tokens, int64_t rows, int table);
  void lookup_tokens_backward(const float* d_out, const int32_t* tokens, int64_t rows, int table);
  // Multi-token prediction on the last chunk (transformer_mtp.cpp).
  void build_mtp(const config::ModelConfig& config, const PrecisionPolicy& precision, ExpertLayout experts);
  // The head's GEMM: this rank's fp32 logits [rows, vocab_local] of the final norm's rows `normed`,
  // in the head's precision recipe (fp32 without one; its reduction, over d_model, is never split).
  void head_logits(float* logits, const float* normed, int64_t rows) const;
  // A paged step's metadata where the kernels read it (staged to a GPU), checked.
  PagedRows stage_paged_rows(const PagedBatch& batch, const PagedKVCache& cache, PagedScratch& s);
  // The head's logits (the whole vocabulary) of `rows` of x ([*, d_model]; through the final norm
  // unless `normed`: already after a final norm).
  const float* paged_logits(const float* x, const std::vector<int64_t>& rows, bool normed, PagedScratch& s);
  // The depths' loss weight of the passes now: model.mtp_loss_weight under cross-entropy, the
  // objective's depth_loss_weight() under one. Whether the depths run at all, and whether their
  // loss trains the depths alone (under an objective: TokenObjective::depth_loss_weight).
  double depth_loss_weight() const;
  bool depths_run() const { return !mtp_.empty() && (objective_ == nullptr || depth_loss_weight() > 0.0); }
  bool depths_alone() const { return objective_ != nullptr; }
  // `packing` on the host (the documents that end the depths' shifted rows), `staged` where the
  // depths' blocks read it (staged_packing: the device's).
  void mtp_forward(Activations& a, const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                   float grad_scale, const Packing& packing, const Packing& staged);
  // Adds the depths' gradient of the main model's output (its final norm's) into d_main, and of
  // the embedding and head into theirs, unless depths_alone().
  void mtp_backward(Activations& a, int64_t batch, int64_t seq, const Packing& staged, float* d_main);
  Block::Saved& saved_for(Activations& a, int layer);
  const Block& block(int layer) const { return blocks_[block_index_.at(layer)]; }

  config::ModelConfig config_;
  TensorParallel tp_;
  std::vector<LayerSpec> specs_;
  std::vector<LayerRange> chunks_;
  int embedding_copy_ = -1;
  int64_t vocab_first_ = 0, vocab_local_ = 0;  // this rank's rows of the embedding and head
  ParameterStore params_;
  std::unique_ptr<kernels::RopeTable> rope_;
  int embed_ = -1, positions_ = -1, head_ = -1;
  std::vector<Block> blocks_;     // the layers held, in order
  std::vector<int> block_index_;  // global layer -> index in blocks_ (-1: another stage's)
  std::optional<Norm> final_norm_;
  std::vector<MtpDepth> mtp_;  // by depth, or one for all (the rank holding the head)
  // The weights depth k (0-based) runs: its own, or the one repeated layer's.
  MtpDepth& mtp_module(int k) { return mtp_[config_.mtp_use_repeated_layer ? 0 : k]; }
  const MtpDepth& mtp_module(int k) const { return mtp_[config_.mtp_use_repeated_layer ? 0 : k]; }
  int mtp_embed_ = -1;         // the embedding table multi-token prediction reads
  MtpTotals mtp_totals_;
  std::vector<double> last_mtp_;
  std::vector<Buffer> mtp_d_;  // by depth: d(loss)/d(h_k) during backward
  Buffer mtp_d_head_;          // a depth's head's gradient of its output
  // Context parallelism: the micro-batch's whole sequences of inputs, targets and document ids.
  std::vector<int32_t> mtp_whole_inputs_, mtp_whole_targets_, mtp_whole_documents_;
  Buffer mtp_d_embedded_;
  Buffer mtp_d_detached_;  // depths_alone(): depth 1's gradient of the main model's output, dropped

  Activations activations_;     // forward_backward's
  Block::Saved shared_saved_;   // with recompute: the one block being recomputed
  Buffer losses_, d_final_, recompute_out_, ce_max_, ce_stats_;
  Workspace work_;
  ParallelScratch tp_scratch_;
  MoeScratch moe_scratch_;  // one set for every MoE layer (blocks and MTP depths)
  ParameterHooks* hooks_ = nullptr;
  ContextAttention* context_ = nullptr;
  TokenObjective* objective_ = nullptr;
  Buffer objective_logp_, objective_scale_;             // on the model's device
  std::vector<float> host_logp_, host_scale_;           // the objective reads and writes host rows
  // Host token arrays uploaded for the kernels on a GPU (buffers.h); unused on the cpu.
  StagedTokens staged_tokens_, staged_targets_, staged_position_ids_, staged_positions_, staged_documents_;
  std::vector<std::vector<int>> unit_params_;
  std::optional<TensorParallelGrads> tp_grads_;
  std::shared_ptr<PrecisionContext> precision_;
  std::shared_ptr<LinearPrecision> head_precision_;  // null: fp32 head
};

}  // namespace loom::model
