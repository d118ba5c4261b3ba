#pragma once
// One tensor-parallel rank's widths of each layer, read off the parameters the model registers
// for that rank (Transformer::parameter_list): the q / k / v projections' rows give the heads it
// holds, the gate / up projections' rows its ffn features, a Mamba-2 mixer's in_proj rows its
// heads and groups, a MoE layer's router, expert and shared-expert weights its experts' shapes.
// Activation sizes follow from these, so a layer kind the model learns to register is planned by
// adding its widths here, never by a second formula for the model's shapes.
#include <cstdint>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/model/linear_precision.h"
#include "loom/model/parameters.h"

namespace loom::plan {

struct LayerWidths {
  int64_t q = 0;       // query width (heads x head_dim) on this rank; 0 = no attention
  int64_t kv = 0;      // one of k / v's width on this rank
  int64_t heads = 0;   // query heads on this rank
  int64_t ffn = 0;     // ffn features on this rank; 0 = no dense MLP
  bool swiglu = false; // gate and up projections (two hidden halves)
  // A Mamba-2 mixer (model/mamba2_mixer.h) on this rank: x's width (heads x head_dim; 0 = no
  // mixer), B's (and C's: groups x state), its heads and groups.
  int64_t mamba_inner = 0, mamba_bc = 0, mamba_heads = 0, mamba_groups = 0;
  // A MoE layer (model/moe_layer.h): the router's experts (all of them; 0 = no MoE), this rank's,
  // the experts' width (the latent size, or d_model), their ffn features and whether gated (SwiGLU);
  // the latent size (0: none); the shared expert's ffn features on this rank (0: none), whether
  // gated, and whether a sigmoid gate scales it.
  int64_t experts = 0, local_experts = 0, expert_width = 0, expert_ffn = 0;
  bool expert_swiglu = false;
  int64_t latent = 0;
  int64_t shared_ffn = 0;
  bool shared_swiglu = false, shared_gate = false;
  // What each routed expert's rows are padded to under the layer's precision recipe
  // (ExpertMlp::padded_rows: 16 or 128 under the FP8 recipes; set by set_expert_row_multiples).
  int64_t expert_row_multiple = 1;
  // The tensor-parallel ranks sharing a MoE layer's tokens: each dispatches, combines and
  // differentiates 1 / token_share of them (TensorParallel::row_part; set by the memory plan).
  int64_t token_share = 1;
  // The tokens of `tokens` (the group's) whose routed part this rank runs.
  int64_t share_of(int64_t tokens) const { return tokens / token_share; }

  bool has_attention() const { return q > 0; }
  bool has_mlp() const { return ffn > 0; }
  bool has_mamba() const { return mamba_inner > 0; }
  bool has_moe() const { return experts > 0; }
  int64_t qkv() const { return q + 2 * kv; }
  int64_t hidden() const { return swiglu ? 2 * ffn : ffn; }
  int64_t mamba_proj() const { return 2 * mamba_inner + 2 * mamba_bc + mamba_heads; }  // z, x, B, C, dt
  int64_t mamba_conv() const { return mamba_inner + 2 * mamba_bc; }                     // x, B, C
  int64_t expert_hidden() const { return expert_swiglu ? 2 * expert_ffn : expert_ffn; }
  int64_t shared_hidden() const { return shared_swiglu ? 2 * shared_ffn : shared_ffn; }
  // The rows this rank's experts compute from `rows`, each expert's padded to expert_row_multiple:
  // at most that multiple less one more per expert, planned at that bound (routing is uneven).
  int64_t padded_expert_rows(int64_t rows) const;
};

// Widths by global layer index, then one entry per multi-token prediction depth (index
// layers + depth - 1: its block). Layers this rank does not hold stay all zero.
std::vector<LayerWidths> layer_widths(const std::vector<model::Parameter>& params, const config::ModelConfig& model);

// The precision recipe of widths entry `index`: its layer's block recipe, a multi-token prediction
// block's (index >= layers) the last layer's, as Transformer::build_mtp sets it.
model::Recipe entry_recipe(const model::PrecisionPolicy& policy, int index, int layers);

// Each MoE layer's expert_row_multiple from the recipe its experts run in (entry_recipe).
void set_expert_row_multiples(std::vector<LayerWidths>& widths, const config::RunConfig& config);

// Rows of the output head (vocabulary) this rank holds; 0 when it holds no head.
int64_t head_rows(const std::vector<model::Parameter>& params, bool tied_embeddings, bool holds_head);

}  // namespace loom::plan
