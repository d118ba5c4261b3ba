#include "loom/interop/hf/hf_config.h"

#include <climits>
#include <cmath>
#include <vector>

#include "loom/core/error.h"
#include "loom/interop/hf/hf_config_reader.h"
#include "loom/interop/hf/hf_moe.h"
#include "loom/interop/hf/hf_nemotron_h.h"
#include "loom/interop/hf/hf_qwen2_moe.h"
#include "loom/interop/hf/hf_rope.h"
#include "loom/model/layer_spec.h"

namespace loom::interop::hf {

using nlohmann::json;

namespace {

constexpr std::string_view kLlamaArchitecture = "LlamaForCausalLM";
constexpr std::string_view kDeciArchitecture = "DeciLMForCausalLM";
constexpr std::string_view kQwen2Architecture = "Qwen2ForCausalLM";

enum class Arch { Llama, Deci, Mixtral, Qwen2, Qwen2Moe, NemotronH };

// What transformers' config classes give an optional key config.json leaves out (LlamaConfig,
// which DeciLMConfig extends; Qwen2Config; MixtralConfig; Qwen2MoeConfig). The sizes stay required: a default
// 4096-wide model would only fail later, on the first tensor's shape.
struct HfDefaults {
  int kv_heads;  // 0: num_attention_heads
  double rms_norm_eps, rope_theta;
};
HfDefaults defaults_of(Arch arch) {
  if (arch == Arch::Mixtral) return {8, 1e-5, 1e6};
  if (arch == Arch::Qwen2Moe) return {16, 1e-6, 10000.0};
  return {0, 1e-6, 10000.0};
}

// A value that leaves the computation as plain Llama's: null, false or 0.
bool neutral(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0.0);
}

// DeciLM block options beyond the ones loom implements must be switched off.
void check_only_known(const json& object, std::initializer_list<std::string_view> known, const std::string& where) {
  for (const auto& [key, value] : object.items()) {
    bool is_known = false;
    for (std::string_view k : known) is_known = is_known || key == k;
    if (is_known) continue;
    std::string valid;
    for (std::string_view k : known) valid += (valid.empty() ? "" : ", ") + std::string(k);
    LOOM_CHECK(neutral(value), where + "." + key + " is " + shown(value) +
                              ": loom does not implement this option (it converts " + valid +
                              "; other keys must be null, false or 0)");
  }
}

// One layer's sizes as block_configs gives them, not yet relative to the model-wide defaults.
model::LayerSpec parse_block(const json& block, int layer, const config::ModelConfig& model, const std::string& where) {
  const std::string at = where + ": block_configs[" + std::to_string(layer) + "]";
  LOOM_CHECK(block.is_object(), at + " is " + shown(block) + "; expected an object with attention and ffn");
  check_only_known(block, {"attention", "ffn"}, at);
  LOOM_CHECK(block.contains("attention") && block.at("attention").is_object(), at + ".attention must be an object");
  LOOM_CHECK(block.contains("ffn") && block.at("ffn").is_object(), at + ".ffn must be an object");
  model::LayerSpec out;

  const json& attention = block.at("attention");
  const ConfigReader a(attention, at + ".attention");
  check_only_known(attention, {"no_op", "n_heads_in_group"}, at + ".attention");
  out.has_attention = !a.boolean("no_op", false);
  if (out.has_attention) {
    const int group = a.positive_int("n_heads_in_group");
    LOOM_CHECK(model.heads % group == 0, at + ".attention.n_heads_in_group = " + std::to_string(group) +
                                        " must divide num_attention_heads = " + std::to_string(model.heads));
    out.kv_heads = model.heads / group;
  }

  const json& ffn = block.at("ffn");
  const ConfigReader f(ffn, at + ".ffn");
  check_only_known(ffn, {"no_op", "ffn_mult", "intermediate_size"}, at + ".ffn");
  if (f.boolean("no_op", false)) {
    out.ffn_size = 0;
    return out;
  }
  std::optional<int> size = f.optional_positive_int("intermediate_size");
  if (f.has("ffn_mult")) {
    const json& m = ffn.at("ffn_mult");
    LOOM_CHECK(m.is_number(), at + ".ffn.ffn_mult is " + shown(m) + "; expected a positive number");
    const std::optional<int> from_mult = decilm_intermediate_size(m.get<double>(), model.d_model);
    LOOM_CHECK(from_mult.has_value() && *from_mult <= max_size("intermediate_size"),
               at + ".ffn.ffn_mult is " + shown(m) + "; expected a positive number giving an ffn size of at most " +
                   std::to_string(max_size("intermediate_size")));
    LOOM_CHECK(!size || *size == *from_mult, at + ".ffn: intermediate_size " + std::to_string(size.value_or(0)) +
                                            " disagrees with ffn_mult " + shown(m) + " (which gives " +
                                            std::to_string(*from_mult) + ")");
    size = from_mult;
  }
  LOOM_CHECK(size.has_value(), at + ".ffn has neither ffn_mult nor intermediate_size (and is not no_op)");
  out.ffn_size = *size;
  return out;
}

}  // namespace

std::optional<int> decilm_intermediate_size(double ffn_mult, int hidden_size) {
  if (!std::isfinite(ffn_mult) || ffn_mult <= 0.0) return std::nullopt;
  // Python's int(2 * ffn_mult * n_embd / 3): the same operations in the same order, truncated.
  const double size = 2.0 * ffn_mult * static_cast<double>(hidden_size) / 3.0;
  if (!(size >= 1.0 && size <= static_cast<double>(INT_MAX - 256))) return std::nullopt;
  int n = static_cast<int>(size);
  if (n % 256 != 0) n += 256 - n % 256;
  return n;
}

std::optional<double> decilm_ffn_mult(int ffn_size, int hidden_size) {
  if (ffn_size <= 0 || hidden_size <= 0 || ffn_size % 256 != 0) return std::nullopt;
  const double mult = 3.0 * static_cast<double>(ffn_size) / (2.0 * static_cast<double>(hidden_size));
  if (decilm_intermediate_size(mult, hidden_size) == ffn_size) return mult;
  return std::nullopt;
}

void check_hf_exportable(const config::ModelConfig& model) {
  const std::string why =
      ": Hugging Face's LlamaForCausalLM / DeciLMForCausalLM cannot compute it, so loom convert --to-hf exports only "
      "Llama-style models (model.norm rms, model.activation swiglu, model.positions rope)";
  if (is_nemotron_h_model(model)) {
    check_nemotron_h_exportable(model);
    return;
  }
  LOOM_CHECK(model.mtp_depths == 0, "model.mtp_depths is " + std::to_string(model.mtp_depths) +
                                        " (multi-token prediction modules, which these architectures do not have)" +
                                        why);
  LOOM_CHECK(model.norm == config::Norm::Rms, "model.norm is '" + config::to_string(model.norm) + "' (LayerNorm)" + why);
  LOOM_CHECK(model.activation == config::Activation::Swiglu,
             "model.activation is '" + config::to_string(model.activation) + "'" + why);
  LOOM_CHECK(model.positions == config::Positions::Rope,
             "model.positions is '" + config::to_string(model.positions) + "'" + why);
  if (is_qwen2_model(model) && !is_moe_model(model)) {
    LOOM_CHECK(model.block_configs.empty(),
               "model.qkv_bias without model.bias exports as Qwen2ForCausalLM, which has no model.block_configs");
  }
}

nlohmann::ordered_json hf_config_json(const config::ModelConfig& model, std::string_view torch_dtype) {
  if (is_nemotron_h_model(model)) return nemotron_h_config_json(model, torch_dtype);
  check_hf_exportable(model);
  const bool qwen2_moe = is_qwen2_moe_model(model);
  if (qwen2_moe) {
    check_qwen2_moe_exportable(model);
  } else if (is_moe_model(model)) {
    check_mixtral_exportable(model);
  }
  LOOM_CHECK(model.vocab_size > 0, "model.vocab_size must be resolved before writing config.json");
  const bool heterogeneous = !model.block_configs.empty();
  const int kv_heads = model.kv_heads == 0 ? model.heads : model.kv_heads;
  nlohmann::ordered_json out;
  const bool qwen2 = is_qwen2_model(model);
  out["architectures"] = {qwen2 ? kQwen2Architecture : heterogeneous ? kDeciArchitecture : kLlamaArchitecture};
  out["model_type"] = qwen2 ? "qwen2" : heterogeneous ? "nemotron-nas" : "llama";
  out["hidden_size"] = model.d_model;
  out["intermediate_size"] = model.ffn_size;
  out["num_hidden_layers"] = model.layers;
  out["num_attention_heads"] = model.heads;
  out["num_key_value_heads"] = kv_heads;
  out["head_dim"] = model::head_dim(model);
  out["vocab_size"] = model.vocab_size;
  out["max_position_embeddings"] = model.max_seq_len;
  out["rms_norm_eps"] = model.norm_eps;
  write_hf_rope(model, out);
  out["tie_word_embeddings"] = model.tied_embeddings;
  out["hidden_act"] = "silu";
  if (qwen2) {  // Qwen2's q/k/v biases are implied by the architecture
    out["use_sliding_window"] = false;
    out["sliding_window"] = nullptr;
  } else {
    out["attention_bias"] = model.bias;
    out["mlp_bias"] = model.bias;
  }
  out["attention_dropout"] = 0.0;
  out["initializer_range"] = model.init_std;
  out["torch_dtype"] = torch_dtype;
  out["use_cache"] = true;
  if (qwen2_moe) {
    add_qwen2_moe_config(out, model);
  } else if (is_moe_model(model)) {
    add_mixtral_config(out, model);
  }
  if (heterogeneous && !is_moe_model(model)) {
    nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
    for (const model::LayerSpec& spec : model::resolve_layers(model)) {
      nlohmann::ordered_json attention, ffn;
      attention["no_op"] = !spec.has_attention;
      if (spec.has_attention) {
        attention["n_heads_in_group"] = model.heads / spec.kv_heads;
      } else {
        attention["n_heads_in_group"] = nullptr;
      }
      attention["replace_with_linear"] = false;
      ffn["no_op"] = !spec.has_mlp();
      if (spec.has_mlp()) {
        if (const std::optional<double> mult = decilm_ffn_mult(spec.ffn_size, model.d_model)) {
          ffn["ffn_mult"] = *mult;
        } else {
          ffn["intermediate_size"] = spec.ffn_size;
        }
      }
      ffn["replace_with_linear"] = false;
      blocks.push_back({{"attention", attention}, {"ffn", ffn}});
    }
    out["block_configs"] = blocks;
  }
  return out;
}

namespace {

// Which architecture config.json describes.
Arch arch_of(const ConfigReader& c, const std::string& where) {
  const std::string valid = "; loom converts LlamaForCausalLM, DeciLMForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
                            "Qwen2MoeForCausalLM and NemotronHForCausalLM";
  if (c.has("architectures")) {
    const json& arch = c.at("architectures");
    LOOM_CHECK(arch.is_array() && arch.size() == 1 && arch[0].is_string(),
          where + ": architectures is " + shown(arch) + "; expected a list of one name" + valid);
    const std::string name = arch[0].get<std::string>();
    if (name == kLlamaArchitecture) return Arch::Llama;
    if (name == kDeciArchitecture) return Arch::Deci;
    if (name == kMixtralArchitecture) return Arch::Mixtral;
    if (name == kQwen2MoeArchitecture) return Arch::Qwen2Moe;
    if (name == kNemotronHArchitecture) return Arch::NemotronH;
    LOOM_CHECK(name == kQwen2Architecture, where + ": architectures is [\"" + name + "\"]" + valid);
    return Arch::Qwen2;
  }
  LOOM_CHECK(c.has("model_type") && c.at("model_type").is_string(),
        where + ": neither architectures nor model_type says which model this is");
  const std::string type = c.at("model_type").get<std::string>();
  if (type == "llama") return Arch::Llama;
  if (type == "nemotron-nas" || type == "deci") return Arch::Deci;
  if (type == "mixtral") return Arch::Mixtral;
  if (type == "qwen2_moe") return Arch::Qwen2Moe;
  if (type == "nemotron_h") return Arch::NemotronH;
  LOOM_CHECK(type == "qwen2", where + ": model_type is '" + type + "'; loom converts llama, nemotron-nas (DeciLM), "
                                                                   "mixtral, qwen2, qwen2_moe and nemotron_h");
  return Arch::Qwen2;
}

// hidden_act must be SwiGLU's; Qwen2's sliding window off.
void check_activation(const ConfigReader& c, Arch arch, const std::string& where) {
  if (c.has("hidden_act")) {
    LOOM_CHECK(c.at("hidden_act") == "silu",
          where + ": hidden_act is " + shown(c.at("hidden_act")) + "; loom's Llama MLP is SwiGLU (hidden_act \"silu\")");
  }
  if (arch == Arch::Qwen2 || arch == Arch::Qwen2Moe) {
    LOOM_CHECK(!c.boolean("use_sliding_window", false),
               where + ": use_sliding_window is true; loom's attention is full causal attention");
  }
}

}  // namespace

config::ModelConfig model_config_from_hf(const json& config, const std::string& where) {
  LOOM_CHECK(config.is_object(), where + ": expected a JSON object");
  const ConfigReader c(config, where);

  const Arch arch = arch_of(c, where);
  if (arch == Arch::NemotronH) return nemotron_h_model_config(config, where);
  const bool deci = arch == Arch::Deci;
  const HfDefaults d = defaults_of(arch);

  config::ModelConfig m;
  m.d_model = c.positive_int("hidden_size");
  m.layers = c.positive_int("num_hidden_layers");
  m.heads = c.positive_int("num_attention_heads");
  m.vocab_size = c.positive_int("vocab_size");
  m.max_seq_len = c.positive_int("max_position_embeddings");
  m.norm = config::Norm::Rms;
  m.activation = config::Activation::Swiglu;
  m.positions = config::Positions::Rope;
  m.norm_eps = c.positive_number("rms_norm_eps", d.rms_norm_eps);
  m.init_std = c.positive_number("initializer_range", 0.02);
  m.tied_embeddings = c.boolean("tie_word_embeddings", false);
  LOOM_CHECK(m.d_model % m.heads == 0, where + ": hidden_size " + std::to_string(m.d_model) +
                                      " is not a multiple of num_attention_heads " + std::to_string(m.heads));
  if (const std::optional<int> head_dim = c.optional_positive_int("head_dim")) {
    LOOM_CHECK(*head_dim == m.d_model / m.heads,
          where + ": head_dim is " + std::to_string(*head_dim) + " but loom's is hidden_size / num_attention_heads = " +
              std::to_string(m.d_model / m.heads));
  }
  check_activation(c, arch, where);
  m.rope_theta = d.rope_theta;
  read_hf_rope(config, m, where);
  const bool attention_bias = c.boolean("attention_bias", false), mlp_bias = c.boolean("mlp_bias", false);
  LOOM_CHECK(attention_bias == mlp_bias, where + ": attention_bias is " + std::string(attention_bias ? "true" : "false") +
                                        " but mlp_bias is " + (mlp_bias ? "true" : "false") +
                                        "; loom's model.bias sets both");
  m.bias = attention_bias;
  m.qkv_bias = arch == Arch::Qwen2 || arch == Arch::Qwen2Moe;

  const std::optional<int> kv_heads = c.optional_positive_int("num_key_value_heads");
  const std::optional<int> ffn_size = c.optional_positive_int("intermediate_size");
  if (!deci) {
    LOOM_CHECK(!c.has("block_configs"), where + ": block_configs belongs to DeciLMForCausalLM, not LlamaForCausalLM");
    LOOM_CHECK(ffn_size.has_value(), where + ": missing key 'intermediate_size' (a positive integer)");
    m.ffn_size = *ffn_size;
    m.kv_heads = kv_heads.value_or(d.kv_heads > 0 ? d.kv_heads : m.heads);
    LOOM_CHECK(m.heads % m.kv_heads == 0, where + ": num_key_value_heads " + std::to_string(m.kv_heads) +
                                         " does not divide num_attention_heads " + std::to_string(m.heads));
    if (arch == Arch::Mixtral) read_mixtral_config(config, m, where);
    if (arch == Arch::Qwen2Moe) read_qwen2_moe_config(config, m, where);
    return m;
  }

  LOOM_CHECK(c.has("block_configs") && c.at("block_configs").is_array(),
        where + ": DeciLMForCausalLM needs block_configs, a list with one entry per layer");
  const json& blocks = c.at("block_configs");
  LOOM_CHECK(blocks.size() == static_cast<size_t>(m.layers),
        where + ": block_configs has " + std::to_string(blocks.size()) + " entries but num_hidden_layers is " +
            std::to_string(m.layers));
  std::vector<model::LayerSpec> specs;
  for (size_t l = 0; l < blocks.size(); ++l) specs.push_back(parse_block(blocks[l], static_cast<int>(l), m, where));
  // The model-wide defaults the per-layer entries are relative to: the top-level keys when
  // given, else the first layer that has the sub-block (else any valid value: it is unused).
  m.kv_heads = kv_heads.value_or(0);
  m.ffn_size = ffn_size.value_or(0);
  for (const model::LayerSpec& spec : specs) {
    if (m.kv_heads == 0 && spec.has_attention) m.kv_heads = spec.kv_heads;
    if (m.ffn_size == 0 && spec.has_mlp()) m.ffn_size = spec.ffn_size;
  }
  if (m.kv_heads == 0 || m.heads % m.kv_heads != 0) m.kv_heads = m.heads;
  if (m.ffn_size == 0) m.ffn_size = 4 * m.d_model;
  for (const model::LayerSpec& spec : specs) {
    config::BlockConfig block;
    block.attention = spec.has_attention ? config::BlockAttention::Normal : config::BlockAttention::Skip;
    block.kv_heads = spec.has_attention && spec.kv_heads != m.kv_heads ? spec.kv_heads : 0;
    block.ffn_size = !spec.has_mlp() ? 0 : spec.ffn_size == m.ffn_size ? -1 : spec.ffn_size;
    m.block_configs.push_back(block);
  }
  return m;
}

}  // namespace loom::interop::hf
