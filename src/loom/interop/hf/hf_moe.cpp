#include "loom/interop/hf/hf_moe.h"

#include "loom/core/error.h"
#include "loom/interop/hf/hf_qwen2_moe.h"

namespace loom::interop::hf {

namespace {

void replace(std::string& s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
}

int positive(const nlohmann::json& config, const char* key, const std::string& where, int max) {
  LOOM_CHECK(config.contains(key), where + ": missing key '" + key + "' (a positive integer), which Mixtral needs");
  const nlohmann::json& v = config.at(key);
  LOOM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= max,
             where + ": " + key + " is " + v.dump() + "; expected an integer in [1, " + std::to_string(max) + "]");
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

bool is_moe_model(const config::ModelConfig& model) {
  if (model.moe.experts > 0) return true;
  for (const config::BlockConfig& b : model.block_configs) {
    if (b.ffn == config::BlockFfn::Moe) return true;
  }
  return false;
}

void check_mixtral_exportable(const config::ModelConfig& model) {
  const std::string why = " cannot be expressed by Hugging Face's MixtralForCausalLM, the architecture loom exports "
                          "mixture-of-experts models as";
  const config::MoeConfig& m = model.moe;
  LOOM_CHECK(model.block_configs.empty(), "model.block_configs (dense and MoE layers mixed, or per-layer sizes)" + why);
  LOOM_CHECK(m.router == config::MoeRouter::TopkSoftmax,
             "model.moe_router = '" + config::to_string(m.router) + "'" + why + " (it routes as topk_softmax)");
  LOOM_CHECK(m.topk_scaling == 1.0, "model.moe_topk_scaling other than 1" + why);
  LOOM_CHECK(m.shared_ffn_size == 0, "model.moe_shared_ffn_size (a shared expert)" + why);
  LOOM_CHECK(m.latent_size == 0, "model.moe_latent_size (latent MoE)" + why);
  LOOM_CHECK(!m.expert_bias, "model.moe_expert_bias (it changes which experts a token picks)" + why);
  LOOM_CHECK(!model.bias, "model.bias" + why);
}

void add_mixtral_config(nlohmann::ordered_json& out, const config::ModelConfig& model) {
  out["architectures"] = {kMixtralArchitecture};
  out["model_type"] = "mixtral";
  out["intermediate_size"] = model.moe.ffn_size > 0 ? model.moe.ffn_size : model.ffn_size;
  out["num_local_experts"] = model.moe.experts;
  out["num_experts_per_tok"] = model.moe.top_k;
  out["router_aux_loss_coef"] = model.moe.aux_loss_coeff;
  out["output_router_logits"] = false;
  out["sliding_window"] = nullptr;
  out.erase("attention_bias");
  out.erase("mlp_bias");
}

void read_mixtral_config(const nlohmann::json& config, config::ModelConfig& model, const std::string& where) {
  LOOM_CHECK(!config.contains("sliding_window") || config.at("sliding_window").is_null(),
             where + ": sliding_window is " + config.at("sliding_window").dump() +
                 "; loom's attention is full causal attention (sliding_window null)");
  model.moe.experts = positive(config, "num_local_experts", where, 65536);
  model.moe.top_k = positive(config, "num_experts_per_tok", where, 64);
  LOOM_CHECK(model.moe.top_k <= model.moe.experts, where + ": num_experts_per_tok " + std::to_string(model.moe.top_k) +
                                                       " exceeds num_local_experts " + std::to_string(model.moe.experts));
  model.moe.ffn_size = model.ffn_size;
  model.moe.router = config::MoeRouter::TopkSoftmax;
  if (config.contains("router_aux_loss_coef") && config.at("router_aux_loss_coef").is_number()) {
    model.moe.aux_loss_coeff = std::max(0.0, config.at("router_aux_loss_coef").get<double>());
  }
}

std::string hf_tensor_name(const config::ModelConfig& model, const std::string& name) {
  // Qwen2-MoE's names are loom's own.
  if (!is_moe_model(model) || is_qwen2_moe_model(model) || name.find(".mlp.") == std::string::npos) return name;
  std::string out = name;
  replace(out, ".mlp.", ".block_sparse_moe.");
  replace(out, ".gate_proj.", ".w1.");
  replace(out, ".down_proj.", ".w2.");
  replace(out, ".up_proj.", ".w3.");
  return out;
}

}  // namespace loom::interop::hf
