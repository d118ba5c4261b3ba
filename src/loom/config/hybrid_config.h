#pragma once
// Hybrid (Nemotron-H) models: the layer pattern's alphabet and the checks that relate
// `model.layer_pattern`, `model.mamba.*` and the other model keys (called by validate_config).
#include <string_view>

#include "loom/config/run_config.h"

namespace loom::config {

// hybrid_override_pattern's characters: Mamba-2, attention, MLP, MoE.
constexpr char kMambaLayer = 'M', kAttentionLayer = '*', kMlpLayer = '-', kMoeLayer = 'E';
constexpr std::string_view kLayerAlphabet = "M*-E";

// Mamba heads after resolving heads = 0 (expand * d_model / head_dim).
int mamba_heads(const ModelConfig& model);

// Throws an Error naming the key (and the layer) when the pattern or the Mamba sizes cannot work.
void check_hybrid(const ModelConfig& model);
// Context parallelism with Mamba layers: each tensor-parallel rank's mixer heads and groups must
// split over the cp ranks (the mixers shard heads).
void check_hybrid_layout(const RunConfig& config);

}  // namespace loom::config
