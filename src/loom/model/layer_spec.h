#pragma once
// Per-layer shapes after applying `model.block_configs` (heterogeneous layers, as Nemotron
// Super's block_configs): each layer may skip attention, use its own kv-head count, its own
// ffn size, or skip its MLP. `model.layer_pattern` (Nemotron-H's hybrid_override_pattern) makes
// each layer one mixer behind one pre-norm: a Mamba-2 mixer (M), attention (*) or an MLP (-).
#include <vector>

#include "loom/config/run_config.h"
#include "loom/kernels/types.h"

namespace loom::model {

struct LayerSpec {
  bool has_attention = true;
  int kv_heads = 0;
  int ffn_size = 0;  // 0 = no MLP sub-block
  bool moe = false;  // the feed-forward sub-block is a mixture of experts (model.moe_*)
  bool has_mamba = false;  // a Mamba-2 mixer in the attention's place
  bool has_mlp() const { return ffn_size > 0; }
};

// Resolves the per-layer specs; a block config that cannot work is an Error naming the layer.
std::vector<LayerSpec> resolve_layers(const config::ModelConfig& config);

int head_dim(const config::ModelConfig& config);

// model.rope_* keys as the kernels' RoPE table takes them.
kernels::RopeScaling rope_scaling(const config::ModelConfig& config);

}  // namespace loom::model
