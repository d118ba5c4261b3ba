#include "loom/interop/hf/hf_nemotron_h.h"

#include <map>

#include "loom/config/hybrid_config.h"
#include "loom/core/error.h"
#include "loom/interop/hf/hf_config_reader.h"
#include "loom/model/parameter_shapes.h"

namespace loom::interop::hf {

using nlohmann::json;

namespace {

const char* const kWhy = " cannot be expressed by Hugging Face's NemotronHForCausalLM, the architecture loom exports "
                         "hybrid models (model.layer_pattern) as";

bool has_layer(const config::ModelConfig& model, char kind) {
  return model.layer_pattern.find(kind) != std::string::npos;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void replace(std::string& s, std::string_view from, std::string_view to) {
  const size_t at = s.find(from);
  if (at != std::string::npos) s.replace(at, from.size(), to);
}

// The layers of a multi-token prediction depth as mtp_hybrid_override_pattern spells them.
std::string mtp_pattern(const config::ModelConfig& model) { return model.moe.experts > 0 ? "*E" : "*-"; }

void check_moe_exportable(const config::ModelConfig& model) {
  const config::MoeConfig& m = model.moe;
  LOOM_CHECK(m.router == config::MoeRouter::Sigmoid,
             "model.moe_router = '" + config::to_string(m.router) + "'" + kWhy + " (it routes by sigmoid scores)");
  LOOM_CHECK(m.shared_ffn_size > 0, std::string("model.moe_shared_ffn_size = 0") + kWhy +
                                        " (every MoE layer has one shared expert)");
  LOOM_CHECK(!m.shared_expert_gate, std::string("model.moe_shared_expert_gate") + kWhy + " (its shared expert is not gated)");
}

}  // namespace

void check_nemotron_h_exportable(const config::ModelConfig& model) {
  LOOM_CHECK(model.norm == config::Norm::Rms, "model.norm = '" + config::to_string(model.norm) + "'" + kWhy);
  LOOM_CHECK(model.positions == config::Positions::None || !has_layer(model, config::kAttentionLayer),
             "model.positions = '" + config::to_string(model.positions) + "'" + kWhy +
                 " (its attention layers see no positions: model.positions must be none)");
  LOOM_CHECK(model.positions != config::Positions::Learned, "model.positions = 'learned'" + std::string(kWhy));
  const bool mlp = has_layer(model, config::kMlpLayer) || has_layer(model, config::kMoeLayer);
  LOOM_CHECK(!mlp || model.activation == config::Activation::Relu2,
             "model.activation = '" + config::to_string(model.activation) + "'" + kWhy +
                 " (its MLPs and experts are up_proj -> relu^2 -> down_proj: model.activation relu2)");
  LOOM_CHECK(!model.bias && !model.qkv_bias, std::string(model.bias ? "model.bias" : "model.qkv_bias") + kWhy);
  LOOM_CHECK(model.block_configs.empty(), std::string("model.block_configs (per-layer sizes)") + kWhy);
  LOOM_CHECK(model.mtp_depths <= 1 || model.mtp_use_repeated_layer,
             "model.mtp_depths = " + std::to_string(model.mtp_depths) +
                 " depths of their own: a Nemotron-H checkpoint holds one multi-token prediction depth's weights "
                 "(num_nextn_predict_layers 1, run at every depth); set model.mtp_use_repeated_layer=true or "
                 "model.mtp_depths=1");
  if (has_layer(model, config::kMoeLayer) || (model.mtp_depths > 0 && model.moe.experts > 0)) {
    check_moe_exportable(model);
  }
}

nlohmann::ordered_json nemotron_h_config_json(const config::ModelConfig& model, std::string_view torch_dtype) {
  check_nemotron_h_exportable(model);
  LOOM_CHECK(model.vocab_size > 0, "model.vocab_size must be resolved before writing config.json");
  const config::MambaConfig& mamba = model.mamba;
  const config::MoeConfig& moe = model.moe;
  nlohmann::ordered_json out;
  out["architectures"] = {kNemotronHArchitecture};
  out["model_type"] = "nemotron_h";
  out["vocab_size"] = model.vocab_size;
  out["hidden_size"] = model.d_model;
  out["num_hidden_layers"] = model.layers;
  out["hybrid_override_pattern"] = model.layer_pattern;
  out["num_attention_heads"] = model.heads;
  out["num_key_value_heads"] = model.kv_heads == 0 ? model.heads : model.kv_heads;
  out["head_dim"] = model.d_model / model.heads;
  out["max_position_embeddings"] = model.max_seq_len;
  out["intermediate_size"] = model.ffn_size;
  out["mlp_hidden_act"] = "relu2";
  out["attention_bias"] = false;
  out["mlp_bias"] = false;
  out["use_bias"] = false;
  out["ssm_state_size"] = mamba.state_size;
  out["mamba_num_heads"] = config::mamba_heads(model);
  out["mamba_head_dim"] = mamba.head_dim;
  out["n_groups"] = mamba.groups;
  out["conv_kernel"] = mamba.conv_kernel;
  out["chunk_size"] = mamba.chunk_size;
  out["expand"] = mamba.expand;
  out["mamba_hidden_act"] = "silu";
  out["use_conv_bias"] = true;
  out["mamba_proj_bias"] = false;
  out["layer_norm_epsilon"] = model.norm_eps;
  out["residual_in_fp32"] = false;
  if (has_layer(model, config::kMoeLayer) || (model.mtp_depths > 0 && moe.experts > 0)) {
    out["n_routed_experts"] = moe.experts;
    out["num_experts_per_tok"] = moe.top_k;
    out["moe_intermediate_size"] = moe.ffn_size > 0 ? moe.ffn_size : model.ffn_size;
    out["n_shared_experts"] = 1;
    out["moe_shared_expert_intermediate_size"] = moe.shared_ffn_size;
    out["moe_latent_size"] = moe.latent_size > 0 ? json(moe.latent_size) : json(nullptr);
    out["n_group"] = 1;
    out["topk_group"] = 1;
    out["norm_topk_prob"] = true;
    out["routed_scaling_factor"] = moe.topk_scaling;
  }
  // Multi-token prediction: one depth's weights, its block attention then the model's
  // feed-forward (model::mtp_block_spec).
  out["num_nextn_predict_layers"] = model.mtp_depths > 0 ? 1 : 0;
  if (model.mtp_depths > 0) out["mtp_hybrid_override_pattern"] = mtp_pattern(model);
  out["tie_word_embeddings"] = model.tied_embeddings;
  out["initializer_range"] = model.init_std;
  out["torch_dtype"] = torch_dtype;
  out["use_cache"] = true;
  return out;
}

namespace {

// A layers_block_type entry's pattern character ('?' for one loom does not know).
char layer_code(const json& kind) {
  const std::string k = kind.is_string() ? kind.get<std::string>() : "";
  return k == "mamba" ? 'M' : k == "attention" ? '*' : k == "mlp" ? '-' : k == "moe" ? 'E' : '?';
}

// The pattern: hybrid_override_pattern, or the newer layers_block_type list.
std::string read_pattern(const ConfigReader& c, const std::string& where) {
  if (c.has("hybrid_override_pattern")) {
    const json& p = c.at("hybrid_override_pattern");
    LOOM_CHECK(p.is_string() && !p.get<std::string>().empty(),
               c.where("hybrid_override_pattern") + " is " + shown(p) + "; expected a string of M, *, - and E");
    return p.get<std::string>();
  }
  LOOM_CHECK(c.has("layers_block_type") && c.at("layers_block_type").is_array(),
             where + ": missing key 'hybrid_override_pattern' (or layers_block_type), the layer kinds");
  std::string out;
  for (const json& kind : c.at("layers_block_type")) {
    const char code = layer_code(kind);
    LOOM_CHECK(code != '?', c.where("layers_block_type") + " holds " + shown(kind) +
                                "; expected \"mamba\", \"attention\", \"mlp\" or \"moe\"");
    out += code;
  }
  return out;
}

// A key that must hold `expected` (or be absent) for loom to compute what Nemotron-H computes.
void expect_value(const ConfigReader& c, const char* key, const json& expected, const std::string& why) {
  if (!c.has(key)) return;
  LOOM_CHECK(c.at(key) == expected, c.where(key) + " is " + shown(c.at(key)) + "; loom converts only " +
                                        expected.dump() + " (" + why + ")");
}

// time_step_limit clamps dt after the softplus; only the default (0, inf) is loom's, however the
// file spells infinity.
void check_time_step_limit(const ConfigReader& c) {
  if (!c.has("time_step_limit")) return;
  const json& v = c.at("time_step_limit");
  auto infinite = [](const json& x) {
    if (x.is_string()) return x == "Infinity" || x == "inf";
    if (x.is_object()) return x.contains("__float__") && x.at("__float__") == "Infinity";
    return x.is_number() && x.get<double>() >= 1e20;
  };
  LOOM_CHECK(v.is_array() && v.size() == 2 && v[0].is_number() && v[0].get<double>() <= 0.0 && infinite(v[1]),
             c.where("time_step_limit") + " is " + shown(v) +
                 "; loom's Mamba-2 does not clamp dt (expected [0.0, Infinity], the default)");
}

void check_unsupported(const ConfigReader& c) {
  expect_value(c, "mlp_hidden_act", "relu2", "squared-ReLU MLPs and experts");
  expect_value(c, "mamba_hidden_act", "silu", "the convolution's activation");
  expect_value(c, "use_conv_bias", true, "the convolution has a bias");
  for (const char* key : {"attention_bias", "mlp_bias", "use_bias", "mamba_proj_bias"})
    expect_value(c, key, false, "loom's hybrid layers have no biases");
  LOOM_CHECK(!c.has("sliding_window"), c.where("sliding_window") + " is " + shown(c.at("sliding_window")) +
                                           "; loom's attention is full causal attention (sliding_window null)");
  check_time_step_limit(c);
}

// Where config.json spells the multi-token prediction depth's layers.
const char* mtp_pattern_key(const ConfigReader& c) {
  return c.has("mtp_hybrid_override_pattern") ? "mtp_hybrid_override_pattern" : "mtp_layers_block_type";
}

// num_nextn_predict_layers: 0, or 1 (one depth's weights) with the depth's layers in
// mtp_hybrid_override_pattern (or mtp_layers_block_type): attention, then an MLP or a MoE.
// Returns the pattern ("" without one).
std::string read_mtp_pattern(const ConfigReader& c) {
  if (!c.has("num_nextn_predict_layers") || c.at("num_nextn_predict_layers") == 0) return "";
  LOOM_CHECK(c.at("num_nextn_predict_layers") == 1,
             c.where("num_nextn_predict_layers") + " is " + shown(c.at("num_nextn_predict_layers")) +
                 "; loom converts one multi-token prediction depth's weights (1) or none (0)");
  std::string pattern;
  if (c.has("mtp_hybrid_override_pattern") && c.at("mtp_hybrid_override_pattern").is_string()) {
    pattern = c.at("mtp_hybrid_override_pattern").get<std::string>();
  } else if (c.has("mtp_layers_block_type") && c.at("mtp_layers_block_type").is_array()) {
    for (const json& kind : c.at("mtp_layers_block_type")) pattern += layer_code(kind);
  }
  LOOM_CHECK(pattern == "*E" || pattern == "*-",
             c.where(mtp_pattern_key(c)) + " is " + (pattern.empty() ? std::string("missing") : "'" + pattern + "'") +
                 "; loom's multi-token prediction depth is one attention layer and one feed-forward layer: \"*E\" "
                 "(a MoE) or \"*-\" (an MLP)");
  return pattern;
}

void read_mamba(const ConfigReader& c, config::ModelConfig& m, const std::string& where) {
  config::MambaConfig& mamba = m.mamba;
  mamba.heads = c.positive_int("mamba_num_heads");
  mamba.head_dim = c.positive_int("mamba_head_dim");
  mamba.state_size = c.positive_int("ssm_state_size");
  mamba.groups = c.has("n_groups") ? c.positive_int("n_groups") : c.positive_int_or("mamba_n_groups", 8);
  mamba.conv_kernel = c.has("conv_kernel") ? c.positive_int("conv_kernel") : c.positive_int_or("mamba_d_conv", 4);
  mamba.chunk_size = c.has("chunk_size") ? c.positive_int("chunk_size") : c.positive_int_or("mamba_chunk_size", 128);
  LOOM_CHECK(mamba.heads % mamba.groups == 0, where + ": n_groups " + std::to_string(mamba.groups) +
                                                  " does not divide mamba_num_heads " + std::to_string(mamba.heads));
}

void read_moe(const ConfigReader& c, config::ModelConfig& m, const std::string& where) {
  config::MoeConfig& moe = m.moe;
  moe.experts = c.positive_int("n_routed_experts");
  moe.top_k = c.positive_int("num_experts_per_tok");
  LOOM_CHECK(moe.top_k <= moe.experts, where + ": num_experts_per_tok " + std::to_string(moe.top_k) +
                                           " exceeds n_routed_experts " + std::to_string(moe.experts));
  moe.ffn_size = c.positive_int("moe_intermediate_size");
  moe.shared_ffn_size = c.positive_int("moe_shared_expert_intermediate_size");
  moe.latent_size = c.optional_positive_int("moe_latent_size").value_or(0);
  LOOM_CHECK(moe.latent_size <= m.d_model, where + ": moe_latent_size " + std::to_string(moe.latent_size) +
                                               " exceeds hidden_size " + std::to_string(m.d_model));
  moe.router = config::MoeRouter::Sigmoid;
  moe.expert_bias = true;  // e_score_correction_bias picks the experts
  moe.topk_scaling = c.positive_number("routed_scaling_factor", 1.0);
  expect_value(c, "n_shared_experts", 1, "one shared expert");
  expect_value(c, "norm_topk_prob", true, "loom's sigmoid router normalises the top-k weights");
  const int groups = c.positive_int_or("n_group", 1);
  LOOM_CHECK(c.positive_int_or("topk_group", 1) == groups,
             where + ": topk_group differs from n_group; loom's router does not restrict experts to groups");
}

}  // namespace

config::ModelConfig nemotron_h_model_config(const json& config, const std::string& where) {
  const ConfigReader c(config, where);
  config::ModelConfig m;
  m.layer_pattern = read_pattern(c, where);
  m.layers = static_cast<int>(m.layer_pattern.size());
  if (const std::optional<int> layers = c.optional_positive_int("num_hidden_layers")) {
    LOOM_CHECK(*layers == m.layers, where + ": num_hidden_layers is " + std::to_string(*layers) + " but the pattern has " +
                                        std::to_string(m.layers) + " layers");
  }
  m.d_model = c.positive_int("hidden_size");
  m.vocab_size = c.positive_int("vocab_size");
  m.max_seq_len = c.positive_int("max_position_embeddings");
  m.heads = c.positive_int("num_attention_heads");
  m.kv_heads = c.positive_int_or("num_key_value_heads", 8);
  m.ffn_size = c.positive_int_or("intermediate_size", 21504);
  LOOM_CHECK(m.d_model % m.heads == 0 && m.heads % m.kv_heads == 0,
             where + ": hidden_size " + std::to_string(m.d_model) + ", num_attention_heads " + std::to_string(m.heads) +
                 " and num_key_value_heads " + std::to_string(m.kv_heads) + " do not divide one another");
  const int head_dim = c.positive_int_or("head_dim", 128);
  LOOM_CHECK(!has_layer(m, config::kAttentionLayer) || head_dim == m.d_model / m.heads,
             where + ": head_dim is " + std::to_string(head_dim) +
                 " but loom's is hidden_size / num_attention_heads = " + std::to_string(m.d_model / m.heads));
  m.norm = config::Norm::Rms;
  m.activation = config::Activation::Relu2;
  m.positions = config::Positions::None;
  m.norm_eps = c.positive_number("layer_norm_epsilon", 1e-5);
  m.init_std = c.positive_number("initializer_range", 0.02);
  m.tied_embeddings = c.boolean("tie_word_embeddings", false);
  check_unsupported(c);
  const std::string mtp = read_mtp_pattern(c);
  m.mtp_depths = mtp.empty() ? 0 : 1;
  if (has_layer(m, config::kMambaLayer)) read_mamba(c, m, where);
  if (has_layer(m, config::kMoeLayer) || mtp == "*E") read_moe(c, m, where);
  // loom's depth takes the model's feed-forward: a MoE exactly when the model has experts.
  LOOM_CHECK(mtp.empty() || (mtp == "*E") == (m.moe.experts > 0),
             c.where(mtp_pattern_key(c)) + " is '" + mtp + "' in a model " +
                 (m.moe.experts > 0 ? "with" : "without") +
                 " MoE layers; loom's multi-token prediction depth has the model's feed-forward (\"" +
                 (m.moe.experts > 0 ? "*E" : "*-") + "\")");
  return m;
}

namespace {

// A layer's names: each mixer under .mixer. behind its .norm.
void rename_mixers(std::string& name) {
  for (const auto& [from, to] : {std::pair<std::string_view, std::string_view>{".input_layernorm.", ".norm."},
                                 {".post_attention_layernorm.", ".norm."},
                                 {".self_attn.", ".mixer."},
                                 {".mlp.", ".mixer."},
                                 {".shared_expert.", ".shared_experts."}})
    replace(name, from, to);
}

// The multi-token prediction depth (loom's mtp.layers.0: enorm, hnorm, eh_proj and one block of
// attention and feed-forward, then final_layernorm) as Nemotron-H's two layers of its pattern:
// mtp.layers.0 (enorm, hnorm, eh_proj, the attention's norm and mixer) and mtp.layers.1 (the
// feed-forward's norm and mixer, final_layernorm).
std::string hf_mtp_name(const std::string& name) {
  const std::string prefix = "mtp.layers.0.";
  LOOM_CHECK(name.rfind(prefix, 0) == 0, "a multi-token prediction tensor outside mtp.layers.0: " + name);
  const std::string rest = name.substr(prefix.size());
  const bool second = rest.starts_with("post_attention_layernorm.") || rest.starts_with("mlp.") ||
                      rest.starts_with("final_layernorm.");
  std::string out = std::string(second ? "mtp.layers.1." : "mtp.layers.0.") + rest;
  rename_mixers(out);
  return out;
}

std::string hf_name(const std::string& name) {
  if (name == "model.embed_tokens.weight") return "backbone.embeddings.weight";
  if (name == "model.norm.weight") return "backbone.norm_f.weight";
  if (name.rfind("mtp.layers.", 0) == 0) return hf_mtp_name(name);
  if (name.rfind("model.layers.", 0) != 0) return name;  // lm_head.weight
  std::string out = "backbone." + name.substr(6);
  rename_mixers(out);
  return out;
}

// Mamba's fused tensors: in_proj from in_proj_{z,x,B,C,dt}, conv1d.{weight,bias} from conv1d_{x,B,C}.
void add_fused(std::vector<HfTensor>& out, const std::string& mixer, const std::vector<std::string>& parts,
               const std::string& loom_kind, const std::string& hf_kind, const std::map<std::string, Shape>& shapes,
               bool conv_weight) {
  HfTensor t{hf_name(mixer + "." + hf_kind), {}, {}, false};
  int64_t rows = 0;
  for (const std::string& part : parts) {
    const std::string name = mixer + "." + loom_kind + "_" + part + (hf_kind == "conv1d.bias" ? ".bias" : ".weight");
    const Shape& shape = shapes.at(name);
    t.pieces.push_back({name, shape});
    rows += shape[0];
  }
  const Shape& first = t.pieces.front().shape;
  t.shape = first.size() == 1 ? Shape{rows} : conv_weight ? Shape{rows, 1, first[1]} : Shape{rows, first[1]};
  out.push_back(std::move(t));
}

}  // namespace

std::vector<HfTensor> nemotron_h_tensors(const config::ModelConfig& model) {
  const std::vector<model::ParameterShape> layout = model::model_parameter_shapes(model);
  std::map<std::string, Shape> shapes;
  for (const model::ParameterShape& p : layout) shapes[p.name] = p.shape;
  std::vector<HfTensor> out;
  for (const model::ParameterShape& p : layout) {
    const std::string& name = p.name;
    const size_t mixer_at = name.find(".mixer.");
    if (mixer_at != std::string::npos && name.find(".mixer.in_proj_") != std::string::npos) {
      if (ends_with(name, ".in_proj_z.weight"))
        add_fused(out, name.substr(0, mixer_at + 6), {"z", "x", "B", "C", "dt"}, "in_proj", "in_proj.weight", shapes,
                  false);
      continue;
    }
    if (mixer_at != std::string::npos && name.find(".mixer.conv1d_") != std::string::npos) {
      const std::string mixer = name.substr(0, mixer_at + 6);
      if (ends_with(name, ".conv1d_x.weight")) add_fused(out, mixer, {"x", "B", "C"}, "conv1d", "conv1d.weight", shapes, true);
      if (ends_with(name, ".conv1d_x.bias")) add_fused(out, mixer, {"x", "B", "C"}, "conv1d", "conv1d.bias", shapes, false);
      continue;
    }
    out.push_back({hf_name(name), p.shape, {{name, p.shape}}, false});
    if (ends_with(name, ".mlp.gate.weight")) {  // the router: its correction bias follows it
      const std::string layer = name.substr(0, name.size() - std::string_view(".weight").size());
      const Shape bias{p.shape[0]};
      out.push_back({hf_name(layer + ".e_score_correction_bias"), bias, {{"state.expert_bias." + layer, bias}}, true});
    }
  }
  return out;
}

}  // namespace loom::interop::hf
