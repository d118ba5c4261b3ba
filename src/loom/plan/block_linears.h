#pragma once
// The linear layers of a pipeline stage's blocks as the step-time model (time_plan.cpp) costs
// them: their shapes, recipes, roles and rows, from the stage's layer widths.
#include <cstdint>

#include "loom/config/run_config.h"
#include "loom/model/linear_precision.h"
#include "loom/plan/activation_memory.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

// Which linear of a block a visit is: the MLP's two keep their interior bf16 on a GPU under the
// bf16 recipe (Mlp::bf16_interior; their GEMMs' outputs under FP8 and MX: Mlp::bf16_hidden), and
// attention its q/k/v and output (Attention::bf16_tensors). Plain: fp32 in and out (a Mamba-2
// mixer's projections, a MoE layer's shared expert, counted as such); ExpertUp / ExpertDown: a
// routed expert's, fp32 in and out apart from their interior, which a GPU keeps bf16 under the bf16
// recipe as the MLP's (ExpertMlp's bf16 interior; their GEMMs' outputs under FP8 and MX: its bf16
// hidden), whose weight gradient is always added to (never written whole), over this rank's share
// of the group's tokens (TensorParallel::row_part); Latent: a latent MoE layer's fc1 / fc2 latent
// projection, fp32 in and out, in the block recipe's 16-bit form (MoeLayer::set_precision), over
// the same share, its weight gradient added to (its FLOPs counted among the MoE layer's:
// model::moe_training_flops_per_token); Replicated: a multi-token prediction depth's eh_proj, an
// fp32 GEMM every tensor-parallel rank computes whole over all rows (MtpDepth), its weight gradient
// added to as well.
enum class LinearRole : uint8_t {
  AttentionQkv,
  AttentionOut,
  MlpUp,
  MlpDown,
  Plain,
  ExpertUp,
  ExpertDown,
  Latent,
  Replicated
};
inline bool is_expert(LinearRole role) { return role == LinearRole::ExpertUp || role == LinearRole::ExpertDown; }

// Calls visit(...) for the linears of one layer (or MTP block) of widths `w` under recipe `r`.
template <typename Visit>
void visit_layer_linears(const config::RunConfig& config, const LayerWidths& w, model::Recipe r, double tokens,
                         Visit& visit) {
  auto dbl = [](int64_t x) { return static_cast<double>(x); };
  const double d = dbl(config.model.d_model);
  if (w.has_attention()) {
    visit(dbl(w.qkv()), d, r, LinearRole::AttentionQkv, 1.0);
    visit(d, dbl(w.q), r, LinearRole::AttentionOut, 1.0);
  }
  if (w.has_mlp()) {
    visit(dbl(w.hidden()), d, r, LinearRole::MlpUp, 1.0);
    visit(d, dbl(w.ffn), r, LinearRole::MlpDown, 1.0);
  }
  if (w.has_mamba()) {
    visit(dbl(w.mamba_proj()), d, r, LinearRole::Plain, 1.0);
    visit(d, dbl(w.mamba_inner), r, LinearRole::Plain, 1.0);
  }
  if (w.shared_ffn > 0) {
    visit(dbl(w.shared_hidden()), d, r, LinearRole::Plain, 1.0);
    visit(d, dbl(w.shared_ffn), r, LinearRole::Plain, 1.0);
  }
  if (w.has_moe() && w.local_experts > 0 && r != model::Recipe::Fp32) {
    // This rank's share of the rows its experts compute at balanced routing of the group's tokens.
    const auto routed = static_cast<int64_t>(tokens);
    const double each =
        dbl(routed_rows(config.model, w, routed)) / dbl(w.local_experts) / tokens / dbl(w.token_share);
    for (int64_t e = 0; e < w.local_experts; ++e) {
      visit(dbl(w.expert_hidden()), dbl(w.expert_width), r, LinearRole::ExpertUp, each);
      visit(dbl(w.expert_width), dbl(w.expert_ffn), r, LinearRole::ExpertDown, each);
    }
  }
  if (w.has_moe() && w.latent > 0 && r != model::Recipe::Fp32) {
    const model::Recipe latent = model::sixteen_bit_recipe(r);
    visit(dbl(w.latent), d, latent, LinearRole::Latent, 1.0 / dbl(w.token_share));
    visit(d, dbl(w.latent), latent, LinearRole::Latent, 1.0 / dbl(w.token_share));
  }
}

// Calls visit(out_features, in_features, recipe, role, rows) for every linear of this rank's layers
// that the step-time model counts, `rows` its GEMMs' rows per token of the micro-batch: attention's
// q/k/v and output projections, dense MLPs' two, Mamba-2 mixers' in and out projections and
// shared experts' two (1 each, the block's recipe), each routed expert's two (its share of
// the rows the rank's experts compute at balanced routing of `tokens`, in the block's recipe:
// MoeLayer::set_precision; the zero rows padding each expert's rows to the 16 or 128 an FP8
// product takes, ExpertMlp::padded_rows, at most 15 or 127 per expert and micro-batch, are costed
// apart: stage_flops.h's expert_padding_flops), and
// a latent MoE layer's two latent projections (1 each, the recipe's 16-bit form).
// On the rank holding the head, each multi-token prediction depth's block likewise (widths index
// layers + depth - 1), under the last layer's recipe as Transformer::build_mtp sets it, and its
// eh_proj [d_model, 2 d_model] in fp32 (Replicated).
template <typename Visit>
void for_each_block_linear(const config::RunConfig& config, const StageMemory& stage, double tokens, Visit visit) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  const int layers = config.model.layers;
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) {
      visit_layer_linears(config, stage.widths[static_cast<size_t>(l)], entry_recipe(policy, l, layers), tokens, visit);
    }
  }
  if (stage.head_rows == 0) return;
  const double d = static_cast<double>(config.model.d_model);
  for (int l = layers; l < layers + config.model.mtp_depths; ++l) {
    visit_layer_linears(config, stage.widths[static_cast<size_t>(l)], entry_recipe(policy, l, layers), tokens, visit);
    visit(d, 2.0 * d, model::Recipe::Fp32, LinearRole::Replicated, 1.0);
  }
}

}  // namespace loom::plan
