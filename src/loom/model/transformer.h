#pragma once
// Decoder-only transformer (GPT-2 and Llama families, heterogeneous layers) with explicit
// forward and backward. Activations live in buffers owned here; with `model.recompute` each
// block keeps only its input and recomputes the rest in backward (activation checkpointing).
#include <memory>
#include <optional>
#include <vector>

#include "loom/kernels/cpu/rope.h"
#include "loom/model/block.h"
#include "loom/model/layer_spec.h"
#include "loom/model/linear_precision.h"
#include "loom/model/norm.h"
#include "loom/model/parameter_hooks.h"
#include "loom/model/parameters.h"
#include "loom/model/tensor_parallel.h"
#include "loom/model/tensor_parallel_grads.h"
#include "loom/runtime/config.h"

namespace loom::model {

// Per-sequence state for generation with a KV cache.
struct DecodeState {
  std::vector<KVCache> caches;  // one per layer
  int64_t length = 0;           // positions already in the caches
  Block::Saved scratch;
  ParallelScratch tp_scratch;
  Norm::Saved final_norm;
  Buffer x, logits;
};

class Transformer {
 public:
  // config.vocab_size must be resolved (> 0). Parameters are allocated, not initialised. With a
  // tensor-parallel group each rank holds its shard of every split parameter (heads, ffn
  // features, vocabulary rows) and the model computes the same function as on one rank; a layer
  // whose sizes cannot be split is an Error naming it.
  // `precision`: the recipe of the linear layers' and the head's GEMMs (default fp32).
  explicit Transformer(const runtime::ModelConfig& config, TensorParallel tp = {}, PrecisionPolicy precision = {});

  void initialize(uint64_t seed) { params_.initialize(seed); }
  ParameterStore& params() { return params_; }
  const ParameterStore& params() const { return params_; }
  const runtime::ModelConfig& config() const { return config_; }
  const std::vector<LayerSpec>& layers() const { return specs_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  // The linear layers' precision state (FP8 amax histories), for the trainer and checkpoints.
  PrecisionContext& precision() { return *precision_; }

  // Forward and backward on one micro-batch: inputs/targets are [batch, seq] (the same on every
  // tensor-parallel rank); targets equal to kIgnoreIndex are masked. Gradients of grad_scale * (sum of token losses) are *added* into
  // params().grads(). Returns the sum of token losses.
  double forward_backward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq,
                          float grad_scale);
  // Sum of token losses without gradients (evaluation).
  double forward_loss(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq);

  // Appends `count` tokens to the sequence and returns the logits [vocab] after the last one
  // (one rank: parallel.tp = 1).
  const float* decode(DecodeState& state, const int32_t* tokens, int64_t count);

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
  void check_tokens(const int32_t* tokens, int64_t rows) const;
  void embed(float* out, const int32_t* tokens, int64_t batch, int64_t seq, int64_t position_start);
  void embed_backward(const float* d_x, const int32_t* tokens, int64_t rows);
  // Sum of token losses; logits_ holds grad_scale * d(loss)/d(logits) after it (when non-zero).
  double cross_entropy(const int32_t* targets, int64_t rows, float grad_scale);
  double forward(const int32_t* inputs, const int32_t* targets, int64_t batch, int64_t seq, float grad_scale);
  Block::Saved& saved_for(int layer) { return config_.recompute ? shared_saved_ : saved_[layer]; }

  runtime::ModelConfig config_;
  TensorParallel tp_;
  std::vector<LayerSpec> specs_;
  int64_t vocab_first_ = 0, vocab_local_ = 0;  // this rank's rows of the embedding and head
  ParameterStore params_;
  std::unique_ptr<kernels::cpu::RopeTable> rope_;
  int embed_ = -1, positions_ = -1, head_ = -1;
  std::vector<Block> blocks_;
  std::optional<Norm> final_norm_;

  // Activations: residual stream before each block (and after the last), per-block saved state.
  std::vector<Buffer> residual_;
  std::vector<Block::Saved> saved_;
  Block::Saved shared_saved_;
  Norm::Saved final_saved_;
  Buffer logits_, losses_, d_residual_, d_final_, recompute_out_, head_input_;
  Buffer ce_max_, ce_stats_;
  std::vector<int32_t> position_ids_;
  Workspace work_;
  ParallelScratch tp_scratch_;
  ParameterHooks* hooks_ = nullptr;
  std::vector<std::vector<int>> unit_params_;
  std::optional<TensorParallelGrads> tp_grads_;
  std::shared_ptr<PrecisionContext> precision_;
  std::shared_ptr<LinearPrecision> head_precision_;  // null: fp32 head
};

}  // namespace loom::model
