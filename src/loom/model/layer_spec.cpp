#include "loom/model/layer_spec.h"

#include <string>

#include "loom/config/hybrid_config.h"
#include "loom/core/error.h"

namespace loom::model {

int head_dim(const config::ModelConfig& config) { return config.d_model / config.heads; }

std::vector<LayerSpec> resolve_layers(const config::ModelConfig& config) {
  LOOM_CHECK(config.block_configs.empty() || static_cast<int>(config.block_configs.size()) == config.layers,
        "model.block_configs has " + std::to_string(config.block_configs.size()) + " entries but model.layers is " +
            std::to_string(config.layers) + " (give one entry per layer, or none)");
  const int default_kv = config.kv_heads == 0 ? config.heads : config.kv_heads;
  std::vector<LayerSpec> specs(config.layers);
  for (int l = 0; l < config.layers; ++l) {
    LayerSpec& spec = specs[l];
    spec.kv_heads = default_kv;
    spec.ffn_size = config.ffn_size;
    if (!config.block_configs.empty()) {
      const config::BlockConfig& block = config.block_configs[l];
      spec.has_attention = block.attention == config::BlockAttention::Normal;
      if (block.kv_heads != 0) spec.kv_heads = block.kv_heads;
      if (block.ffn_size >= 0) spec.ffn_size = block.ffn_size;
      spec.moe = block.ffn == config::BlockFfn::Moe || (block.ffn == config::BlockFfn::Default && config.moe.experts > 0);
    } else {
      spec.moe = config.moe.experts > 0;
    }
    if (!config.layer_pattern.empty()) {
      // The pattern decides the layer's one mixer (config::check_hybrid validated it).
      const char kind = config.layer_pattern.at(l);
      spec.has_attention = kind == config::kAttentionLayer;
      spec.has_mamba = kind == config::kMambaLayer;
      spec.moe = kind == config::kMoeLayer;
      if (kind != config::kMlpLayer && kind != config::kMoeLayer) spec.ffn_size = 0;
    }
    spec.moe = spec.moe && spec.has_mlp();
    LOOM_CHECK(spec.kv_heads >= 1 && config.heads % spec.kv_heads == 0,
          "layer " + std::to_string(l) + ": kv_heads " + std::to_string(spec.kv_heads) +
              " must divide heads " + std::to_string(config.heads));
  }
  return specs;
}

kernels::RopeScaling rope_scaling(const config::ModelConfig& c) {
  kernels::RopeScaling s;
  s.type = c.rope_scaling == config::RopeScaling::Llama3 ? kernels::RopeScaling::Type::Llama3
           : c.rope_scaling == config::RopeScaling::Yarn ? kernels::RopeScaling::Type::Yarn
                                                         : kernels::RopeScaling::Type::None;
  s.factor = c.rope_scaling_factor;
  s.low_freq_factor = c.rope_low_freq_factor;
  s.high_freq_factor = c.rope_high_freq_factor;
  s.original_max_positions = c.rope_original_max_positions;
  s.beta_fast = c.rope_beta_fast;
  s.beta_slow = c.rope_beta_slow;
  return s;
}

}  // namespace loom::model
