#include "loom/config/hybrid_config.h"

#include <string>

#include "loom/core/error.h"

namespace loom::config {

int mamba_heads(const ModelConfig& model) {
  const MambaConfig& m = model.mamba;
  return m.heads > 0 ? m.heads : m.expand * model.d_model / m.head_dim;
}

namespace {

void check_pattern(const ModelConfig& model) {
  const std::string& p = model.layer_pattern;
  LOOM_CHECK(static_cast<int>(p.size()) == model.layers,
             "model.layer_pattern = '" + p + "' has " + std::to_string(p.size()) +
                 " characters but model.layers = " + std::to_string(model.layers) + " (one character per layer)");
  for (size_t i = 0; i < p.size(); ++i) {
    LOOM_CHECK(kLayerAlphabet.find(p[i]) != std::string_view::npos,
               "model.layer_pattern = '" + p + "': layer " + std::to_string(i) + " is '" + std::string(1, p[i]) +
                   "'; valid characters: M (Mamba-2), * (attention), - (MLP), E (MoE)");
    LOOM_CHECK(p[i] != kMoeLayer || model.moe.experts > 0,
               "model.layer_pattern = '" + p + "': layer " + std::to_string(i) +
                   " is 'E' (MoE), which needs model.moe_experts > 0 (the number of experts)");
  }
  for (size_t i = 0; i < model.block_configs.size(); ++i) {
    LOOM_CHECK(model.block_configs[i].attention == BlockAttention::Normal,
               "model.block_configs[" + std::to_string(i) +
                   "].attention = skip cannot be combined with model.layer_pattern (the pattern says which "
                   "layers are attention layers)");
  }
}

void check_mamba(const ModelConfig& model) {
  const MambaConfig& m = model.mamba;
  if (m.heads == 0) {
    LOOM_CHECK(m.expand * model.d_model % m.head_dim == 0,
               "model.mamba.head_dim = " + std::to_string(m.head_dim) + " must divide model.mamba.expand * "
               "model.d_model = " + std::to_string(m.expand * model.d_model) + " (or set model.mamba.heads)");
  }
  const int heads = mamba_heads(model);
  LOOM_CHECK(heads % m.groups == 0, "model.mamba.groups = " + std::to_string(m.groups) +
                                        " must divide the Mamba heads (" + std::to_string(heads) + ")");
}

}  // namespace

void check_hybrid(const ModelConfig& model) {
  if (model.layer_pattern.empty()) return;
  check_pattern(model);
  if (model.layer_pattern.find(kMambaLayer) != std::string::npos) check_mamba(model);
}

void check_hybrid_layout(const RunConfig& config) {
  const bool mamba = config.model.layer_pattern.find(kMambaLayer) != std::string::npos;
  if (!mamba || config.parallel.cp == 1) return;
  // Context parallelism shards the mixers' heads and groups (model/mamba2_mixer.h): each
  // tensor-parallel rank's must split evenly over the cp ranks.
  const int tp = config.parallel.tp, cp = config.parallel.cp, heads = mamba_heads(config.model);
  const int groups = config.model.mamba.groups;
  LOOM_CHECK(heads % tp == 0 && groups % tp == 0 && (heads / tp) % cp == 0 && (groups / tp) % cp == 0,
             "parallel.cp = " + std::to_string(cp) + " splits the Mamba-2 heads and groups of each tensor-parallel "
             "rank over the context-parallel ranks, but a rank (parallel.tp = " + std::to_string(tp) + ") holds " +
                 std::to_string(heads) + " / " + std::to_string(tp) + " heads in model.mamba.groups = " +
                 std::to_string(groups) + " / " + std::to_string(tp) +
                 " groups: both must be multiples of parallel.cp");
}

}  // namespace loom::config
