#include "loom/interop/hf/hf_qwen2_moe.h"

#include <algorithm>
#include <set>

#include "loom/core/error.h"
#include "loom/interop/hf/hf_moe.h"

namespace loom::interop::hf {

namespace {

const char* const kWhy = " cannot be expressed by Hugging Face's Qwen2MoeForCausalLM, the architecture loom exports "
                         "mixture-of-experts models with q/k/v biases or a shared expert as";

// A value from config.json in a message.
std::string shown(const nlohmann::json& v) {
  const std::string text = v.dump();
  return text.size() <= 80 ? text : std::string("a JSON ") + v.type_name();
}

int positive(const nlohmann::json& config, const char* key, const std::string& where, int max) {
  LOOM_CHECK(config.contains(key) && !config.at(key).is_null(),
             where + ": missing key '" + key + "' (a positive integer), which Qwen2MoeForCausalLM needs");
  const nlohmann::json& v = config.at(key);
  LOOM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= max,
             where + ": " + key + " is " + shown(v) + "; expected an integer in [1, " + std::to_string(max) + "]");
  return static_cast<int>(v.get<int64_t>());
}

bool flag(const nlohmann::json& config, const char* key, bool fallback, const std::string& where) {
  if (!config.contains(key) || config.at(key).is_null()) return fallback;
  LOOM_CHECK(config.at(key).is_boolean(), where + ": " + key + " is " + shown(config.at(key)) + "; expected true or false");
  return config.at(key).get<bool>();
}

// Qwen2MoeDecoderLayer's rule: layer i is sparse unless listed in mlp_only_layers, and only
// every decoder_sparse_step-th layer ((i + 1) % step == 0) is.
std::vector<bool> sparse_layers(const nlohmann::json& config, int layers, const std::string& where) {
  const int step = config.contains("decoder_sparse_step") && !config.at("decoder_sparse_step").is_null()
                       ? positive(config, "decoder_sparse_step", where, 1024)
                       : 1;
  std::set<int> dense;
  if (config.contains("mlp_only_layers") && !config.at("mlp_only_layers").is_null()) {
    const nlohmann::json& list = config.at("mlp_only_layers");
    LOOM_CHECK(list.is_array(), where + ": mlp_only_layers is " + shown(list) + "; expected a list of layer indices");
    for (const nlohmann::json& v : list) {
      LOOM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < layers,
                 where + ": mlp_only_layers holds " + shown(v) + "; expected layer indices in [0, " +
                     std::to_string(layers) + ")");
      dense.insert(static_cast<int>(v.get<int64_t>()));
    }
  }
  std::vector<bool> out(layers);
  for (int i = 0; i < layers; ++i) out[i] = dense.count(i) == 0 && (i + 1) % step == 0;
  return out;
}

}  // namespace

bool is_qwen2_moe_model(const config::ModelConfig& model) {
  return is_moe_model(model) && (model.qkv_bias || model.moe.shared_ffn_size > 0);
}

void check_qwen2_moe_exportable(const config::ModelConfig& model) {
  const config::MoeConfig& m = model.moe;
  LOOM_CHECK(m.shared_ffn_size > 0, std::string("model.moe_shared_ffn_size = 0") + kWhy +
                                        " (every sparse block has a shared expert)");
  LOOM_CHECK(m.shared_expert_gate, std::string("model.moe_shared_expert_gate = false") + kWhy +
                                       " (it scales the shared expert by sigmoid(shared_expert_gate(x)))");
  LOOM_CHECK(model.qkv_bias && !model.bias, std::string(model.bias ? "model.bias" : "model.qkv_bias = false") + kWhy +
                                                " (its attention has q/k/v biases only)");
  LOOM_CHECK(m.router == config::MoeRouter::TopkSoftmax || m.router == config::MoeRouter::SoftmaxTopk,
             "model.moe_router = '" + config::to_string(m.router) + "'" + kWhy +
                 " (it routes by softmax: topk_softmax or softmax_topk)");
  LOOM_CHECK(m.topk_scaling == 1.0, std::string("model.moe_topk_scaling other than 1") + kWhy);
  LOOM_CHECK(m.latent_size == 0, std::string("model.moe_latent_size (latent MoE)") + kWhy);
  LOOM_CHECK(!m.expert_bias, std::string("model.moe_expert_bias (it changes which experts a token picks)") + kWhy);
  for (size_t i = 0; i < model.block_configs.size(); ++i) {
    const config::BlockConfig& b = model.block_configs[i];
    const std::string at = "model.block_configs[" + std::to_string(i) + "]";
    LOOM_CHECK(b.attention == config::BlockAttention::Normal, at + ".attention = skip" + kWhy);
    LOOM_CHECK(b.kv_heads == 0 || b.kv_heads == model.kv_heads, at + ".kv_heads (per-layer kv heads)" + kWhy);
    LOOM_CHECK(b.ffn_size == -1, at + ".ffn_size (per-layer ffn sizes; its dense layers are model.ffn_size)" + kWhy);
  }
}

void add_qwen2_moe_config(nlohmann::ordered_json& out, const config::ModelConfig& model) {
  const config::MoeConfig& m = model.moe;
  out["architectures"] = {kQwen2MoeArchitecture};
  out["model_type"] = "qwen2_moe";
  out.erase("attention_bias");
  out.erase("mlp_bias");
  out["qkv_bias"] = true;
  out["use_sliding_window"] = false;
  out["sliding_window"] = nullptr;
  out["max_window_layers"] = model.layers;
  out["num_experts"] = m.experts;
  out["num_experts_per_tok"] = m.top_k;
  out["moe_intermediate_size"] = m.ffn_size > 0 ? m.ffn_size : model.ffn_size;
  out["shared_expert_intermediate_size"] = m.shared_ffn_size;
  out["norm_topk_prob"] = m.router == config::MoeRouter::TopkSoftmax;
  out["decoder_sparse_step"] = 1;
  nlohmann::ordered_json dense = nlohmann::ordered_json::array();
  for (size_t i = 0; i < model.block_configs.size(); ++i) {
    if (model.block_configs[i].ffn == config::BlockFfn::Dense) dense.push_back(i);
  }
  out["mlp_only_layers"] = dense;
  out["router_aux_loss_coef"] = m.aux_loss_coeff;
  out["output_router_logits"] = false;
}

void read_qwen2_moe_config(const nlohmann::json& config, config::ModelConfig& model, const std::string& where) {
  LOOM_CHECK(flag(config, "qkv_bias", true, where),
             where + ": qkv_bias is false; loom's Qwen2-MoE attention has q/k/v biases (model.qkv_bias)");
  config::MoeConfig& m = model.moe;
  m.experts = positive(config, "num_experts", where, 65536);
  m.top_k = positive(config, "num_experts_per_tok", where, 64);
  LOOM_CHECK(m.top_k <= m.experts, where + ": num_experts_per_tok " + std::to_string(m.top_k) +
                                       " exceeds num_experts " + std::to_string(m.experts));
  m.ffn_size = positive(config, "moe_intermediate_size", where, 1048576);
  m.shared_ffn_size = positive(config, "shared_expert_intermediate_size", where, 1048576);
  m.shared_expert_gate = true;
  // Softmax over every expert, top-k, then renormalised over the k: softmax over the k logits.
  m.router = flag(config, "norm_topk_prob", false, where) ? config::MoeRouter::TopkSoftmax
                                                          : config::MoeRouter::SoftmaxTopk;
  m.aux_loss_coeff = 0.001;  // Qwen2MoeConfig's router_aux_loss_coef
  if (config.contains("router_aux_loss_coef") && !config.at("router_aux_loss_coef").is_null()) {
    const nlohmann::json& v = config.at("router_aux_loss_coef");
    LOOM_CHECK(v.is_number() && v.get<double>() >= 0.0,
               where + ": router_aux_loss_coef is " + shown(v) + "; expected a non-negative number");
    m.aux_loss_coeff = v.get<double>();
  }
  const std::vector<bool> sparse = sparse_layers(config, model.layers, where);
  if (std::all_of(sparse.begin(), sparse.end(), [](bool s) { return s; })) return;
  model.block_configs.assign(model.layers, config::BlockConfig{});
  for (int i = 0; i < model.layers; ++i) model.block_configs[i].ffn = sparse[i] ? config::BlockFfn::Moe : config::BlockFfn::Dense;
}

}  // namespace loom::interop::hf
