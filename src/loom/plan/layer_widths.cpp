#include "loom/plan/layer_widths.h"

#include <algorithm>
#include <string>

#include "loom/model/transformer.h"

namespace loom::plan {

namespace {

// "model.layers.12.mlp.up_proj.weight" -> 12 and "mlp.up_proj.weight"; a multi-token prediction
// depth's "mtp.layers.1.self_attn.q_proj.weight" -> layers + 1 and "self_attn.q_proj.weight";
// -1 for other names.
int layer_of(const std::string& name, int layers, std::string& rest) {
  for (const auto& [prefix, first] : {std::pair<std::string, int>{"model.layers.", 0}, {"mtp.layers.", layers}}) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return -1;
    rest = name.substr(dot + 1);
    return first + std::stoi(name.substr(prefix.size(), dot - prefix.size()));
  }
  return -1;
}

// A MoE layer's parameters (rest after "mlp.").
void read_moe(LayerWidths& w, const std::string& rest, const model::Parameter& p) {
  const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 0;
  if (rest == "gate.weight") {
    w.experts = rows;
  } else if (rest == "fc1_latent_proj.weight") {
    w.latent = rows;
  } else if (rest == "shared_expert_gate.weight") {
    w.shared_gate = true;
  } else if (rest == "shared_expert.gate_proj.weight") {
    w.shared_swiglu = true;
  } else if (rest == "shared_expert.up_proj.weight") {
    w.shared_ffn = rows;
  } else if (rest.starts_with("experts.") && rest.ends_with(".up_proj.weight")) {
    w.local_experts += 1;
    w.expert_ffn = rows;
    w.expert_width = cols;
  } else if (rest.starts_with("experts.") && rest.ends_with(".gate_proj.weight")) {
    w.expert_swiglu = true;
  }
}

}  // namespace

std::vector<LayerWidths> layer_widths(const std::vector<model::Parameter>& params, const config::ModelConfig& model) {
  const int layers = model.layers, total = layers + model.mtp_depths;
  const int64_t head_dim = model::head_dim(model);
  std::vector<LayerWidths> out(static_cast<size_t>(total));
  for (const model::Parameter& p : params) {
    std::string rest;
    const int l = layer_of(p.name, layers, rest);
    if (l < 0 || l >= total || p.shape.empty()) continue;
    LayerWidths& w = out[static_cast<size_t>(l)];
    const int64_t rows = p.shape[0];
    if (rest == "self_attn.q_proj.weight") {
      w.q = rows;
      w.heads = rows / head_dim;
    } else if (rest == "self_attn.k_proj.weight") {
      w.kv = rows;
    } else if (rest == "mlp.gate_proj.weight") {
      w.swiglu = true;
    } else if (rest == "mlp.up_proj.weight") {
      w.ffn = rows;
    } else if (rest == "mixer.in_proj_x.weight") {
      w.mamba_inner = rows;
    } else if (rest == "mixer.in_proj_B.weight") {
      w.mamba_bc = rows;
      w.mamba_groups = rows / model.mamba.state_size;
    } else if (rest == "mixer.in_proj_dt.weight") {
      w.mamba_heads = rows;
    } else if (rest.starts_with("mlp.")) {
      read_moe(w, rest.substr(4), p);
    }
  }
  // One depth's weights run at every depth: each has the first one's widths.
  if (model.mtp_use_repeated_layer) {
    for (int l = layers + 1; l < total; ++l) out[static_cast<size_t>(l)] = out[static_cast<size_t>(layers)];
  }
  return out;
}

int64_t LayerWidths::padded_expert_rows(int64_t rows) const {
  return rows + local_experts * (expert_row_multiple - 1);
}

model::Recipe entry_recipe(const model::PrecisionPolicy& policy, int index, int layers) {
  return policy.block_recipe(std::min(index, layers - 1), layers);
}

void set_expert_row_multiples(std::vector<LayerWidths>& widths, const config::RunConfig& config) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  for (size_t l = 0; l < widths.size(); ++l) {
    widths[l].expert_row_multiple =
        model::device_gemm_multiple(entry_recipe(policy, static_cast<int>(l), config.model.layers));
  }
}

int64_t head_rows(const std::vector<model::Parameter>& params, bool tied_embeddings, bool holds_head) {
  if (!holds_head) return 0;
  for (const model::Parameter& p : params) {
    if (p.name == "lm_head.weight") return p.shape[0];
  }
  if (tied_embeddings) {
    for (const model::Parameter& p : params) {
      if (p.name == "model.embed_tokens.weight") return p.shape[0];
    }
  }
  return 0;
}

}  // namespace loom::plan
