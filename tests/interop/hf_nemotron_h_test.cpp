// Nemotron-H from Hugging Face: a hand-written config.json (NemotronHConfig's keys) and
// safetensors whose tensors this test names and fuses itself from a loom model's weights
// (backbone.*, in_proj = [z; x; B; C; dt], conv1d = [x; B; C] as [channels, 1, taps], the
// router's e_score_correction_bias) import to a model whose logits equal that model's; a wrong
// in_proj order or a dropped correction bias is caught; config.json round-trips and what loom
// cannot compute is refused naming the key; a multi-token prediction depth imports from its two
// layers (below).
#include <gtest/gtest.h>

#include "../ckpt/ckpt_test_util.h"
#include "hf_config_expect.h"
#include "hf_import_support.h"
#include "loom/core/error.h"
#include "loom/interop/hf/hf_config.h"

namespace loom::interop::hf {
namespace {

using nlohmann::json;
using namespace testing;

config::ModelConfig hybrid_model() {
  config::ModelConfig m;
  m.vocab_size = 256;
  m.d_model = 16;
  m.layers = 4;
  m.layer_pattern = "M*-E";
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_size = 24;
  m.max_seq_len = 32;
  m.activation = config::Activation::Relu2;
  m.positions = config::Positions::None;
  m.tied_embeddings = false;
  m.norm_eps = 1e-5;
  m.init_std = 0.3;
  m.mamba = {.state_size = 4, .heads = 4, .head_dim = 8, .groups = 2, .conv_kernel = 3, .chunk_size = 4};
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_size = 8;
  m.moe.shared_ffn_size = 12;
  m.moe.latent_size = 8;
  m.moe.router = config::MoeRouter::Sigmoid;
  m.moe.expert_bias = true;
  m.moe.topk_scaling = 1.5;
  return m;
}

json nemotron_h_config_json() {
  return json{{"architectures", {"NemotronHForCausalLM"}},
              {"model_type", "nemotron_h"},
              {"vocab_size", 256},
              {"hidden_size", 16},
              {"num_hidden_layers", 4},
              {"hybrid_override_pattern", "M*-E"},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 4},
              {"max_position_embeddings", 32},
              {"intermediate_size", 24},
              {"mlp_hidden_act", "relu2"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"use_bias", false},
              {"ssm_state_size", 4},
              {"mamba_num_heads", 4},
              {"mamba_head_dim", 8},
              {"n_groups", 2},
              {"conv_kernel", 3},
              {"chunk_size", 4},
              {"expand", 2},
              {"mamba_hidden_act", "silu"},
              {"use_conv_bias", true},
              {"time_step_limit", {0.0, "Infinity"}},
              {"layer_norm_epsilon", 1e-5},
              {"residual_in_fp32", true},
              {"n_routed_experts", 4},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 8},
              {"moe_shared_expert_intermediate_size", 12},
              {"moe_latent_size", 8},
              {"n_shared_experts", 1},
              {"n_group", 1},
              {"topk_group", 1},
              {"norm_topk_prob", true},
              {"routed_scaling_factor", 1.5},
              {"num_nextn_predict_layers", 0},
              {"tie_word_embeddings", false}};
}

// Nemotron-H's names for a loom parameter, written out here independently of the converter.
std::string renamed(std::string name) {
  auto sub = [&](const std::string& from, const std::string& to) {
    const size_t at = name.find(from);
    if (at != std::string::npos) name.replace(at, from.size(), to);
  };
  if (name == "model.embed_tokens.weight") return "backbone.embeddings.weight";
  if (name == "model.norm.weight") return "backbone.norm_f.weight";
  sub("model.layers.", "backbone.layers.");
  for (const char* norm : {".input_layernorm.", ".post_attention_layernorm."}) sub(norm, ".norm.");
  sub(".self_attn.", ".mixer.");
  sub(".mlp.", ".mixer.");
  sub(".shared_expert.", ".shared_experts.");
  return name;
}

NamedTensor stacked(const Tensors& loom, const std::string& prefix, const std::vector<std::string>& parts,
                    const std::string& suffix) {
  NamedTensor out;
  int64_t rows = 0;
  for (const std::string& part : parts) {
    const NamedTensor& t = loom.at(prefix + part + suffix);
    out.values.insert(out.values.end(), t.values.begin(), t.values.end());
    rows += t.shape[0];
    out.shape = t.shape;
  }
  out.shape[0] = rows;
  return out;
}

// The Hugging Face tensors of `reference`, with in_proj's pieces in `order`.
Tensors nemotron_h_tensors_of(model::Transformer& reference, const std::vector<std::string>& order) {
  const Tensors loom = parameters_of(reference);
  Tensors out;
  for (const auto& [name, t] : loom) {
    if (name.find(".mixer.in_proj_") != std::string::npos || name.find(".mixer.conv1d_") != std::string::npos) continue;
    out[renamed(name)] = t;
  }
  const std::string mixer = "model.layers.0.mixer.";
  out["backbone.layers.0.mixer.in_proj.weight"] = stacked(loom, mixer + "in_proj_", order, ".weight");
  NamedTensor conv = stacked(loom, mixer + "conv1d_", {"x", "B", "C"}, ".weight");
  conv.shape = {conv.shape[0], 1, conv.shape[1]};
  out["backbone.layers.0.mixer.conv1d.weight"] = conv;
  out["backbone.layers.0.mixer.conv1d.bias"] = stacked(loom, mixer + "conv1d_", {"x", "B", "C"}, ".bias");
  const std::vector<float>& bias = reference.moe_layers().front()->expert_bias();
  out["backbone.layers.3.mixer.gate.e_score_correction_bias"] = {{4}, bias};
  return out;
}

const std::vector<int32_t> kTokens = {3, 200, 17, 17, 90, 41, 255, 0, 64};

TEST(HfNemotronHImport, LogitsEqualTheModelWhoseWeightsWereWritten) {
  ckpt::test::TempDir dir;
  model::Transformer reference(hybrid_model());
  reference.initialize(13);
  reference.moe_layers().front()->expert_bias() = {0.6f, -0.5f, 0.2f, -0.1f};
  const std::vector<float> expected = decode_logits(reference, kTokens);
  const std::vector<std::string> order = {"z", "x", "B", "C", "dt"};
  const Tensors tensors = nemotron_h_tensors_of(reference, order);
  ASSERT_EQ(tensors.at("backbone.layers.0.mixer.in_proj.weight").shape, (Shape{2 * 32 + 2 * 2 * 4 + 4, 16}));
  const std::string hf = dir / "nemotron";
  write_hf_dir(hf, nemotron_h_config_json(), tensors);
  EXPECT_LE(relative_difference(expected, imported_logits(hf, "ok", kTokens)), 1e-6);

  // config.json as Python's json module writes infinity (a bare Infinity, not JSON) reads the same.
  std::string text = nemotron_h_config_json().dump(2);
  const std::string quoted = "\"Infinity\"";
  text.replace(text.find(quoted), quoted.size(), "Infinity");
  write_file_atomic(hf + "/config.json", text);
  EXPECT_LE(relative_difference(expected, imported_logits(hf, "bare-infinity", kTokens)), 1e-6);

  // The newer spelling of the pattern reads the same.
  json listed = nemotron_h_config_json();
  listed.erase("hybrid_override_pattern");
  listed["layers_block_type"] = {"mamba", "attention", "mlp", "moe"};
  write_hf_dir(hf, listed, tensors);
  EXPECT_LE(relative_difference(expected, imported_logits(hf, "listed", kTokens)), 1e-6);

  // The test can fail: z and x swapped in in_proj, or the correction bias dropped.
  write_hf_dir(hf, nemotron_h_config_json(), nemotron_h_tensors_of(reference, {"x", "z", "B", "C", "dt"}));
  EXPECT_GT(relative_difference(expected, imported_logits(hf, "swapped", kTokens)), 1e-3);
  Tensors unbiased = tensors;
  std::fill_n(unbiased.at("backbone.layers.3.mixer.gate.e_score_correction_bias").values.begin(), 4, 0.0f);
  write_hf_dir(hf, nemotron_h_config_json(), unbiased);
  EXPECT_GT(relative_difference(expected, imported_logits(hf, "unbiased", kTokens)), 1e-3);
}

TEST(HfNemotronHConfig, WritesAndReadsBack) {
  const config::ModelConfig m = hybrid_model();
  const json c = json::parse(hf_config_json(m, "float32").dump());
  EXPECT_EQ(c.at("architectures"), json::array({"NemotronHForCausalLM"}));
  EXPECT_EQ(c.at("hybrid_override_pattern"), "M*-E");
  EXPECT_EQ(c.at("mamba_num_heads"), 4);
  EXPECT_EQ(c.at("n_groups"), 2);
  EXPECT_EQ(c.at("moe_latent_size"), 8);
  EXPECT_EQ(c.at("routed_scaling_factor"), 1.5);
  const config::ModelConfig back = model_config_from_hf(c, "config.json");
  EXPECT_EQ(back.layer_pattern, "M*-E");
  EXPECT_EQ(back.positions, config::Positions::None);
  EXPECT_EQ(back.activation, config::Activation::Relu2);
  EXPECT_EQ(back.mamba.heads, 4);
  EXPECT_EQ(back.mamba.state_size, 4);
  EXPECT_EQ(back.mamba.conv_kernel, 3);
  EXPECT_EQ(back.mamba.chunk_size, 4);
  EXPECT_EQ(back.moe.latent_size, 8);
  EXPECT_EQ(back.moe.topk_scaling, 1.5);
  EXPECT_TRUE(back.moe.expert_bias);
  EXPECT_EQ(back.kv_heads, 2);
}

TEST(HfNemotronHConfig, RefusesWhatLoomCannotComputeNamingTheKey) {
  const std::vector<std::pair<std::string, json>> changes = {
      {"time_step_limit", json::array({0.0, 100.0})},  {"mlp_hidden_act", "silu"},
      {"num_nextn_predict_layers", 2},                 {"norm_topk_prob", false},
      {"use_conv_bias", false},                        {"head_dim", 8},
      {"hybrid_override_pattern", "M*-X"},             {"n_groups", 3},
      {"mamba_proj_bias", true},                       {"sliding_window", 16}};
  for (const auto& [key, value] : changes) {
    json c = nemotron_h_config_json();
    c[key] = value;
    SCOPED_TRACE(key);
    if (key == "hybrid_override_pattern") {
      // A character loom does not know is refused by the run config's own check of the pattern.
      EXPECT_THROW(config::validate_config([&] {
                     config::RunConfig run;
                     run.model = model_config_from_hf(c, "config.json");
                     return run;
                   }()),
                   Error);
      continue;
    }
    expect_refused(c, key);
  }
  json c = nemotron_h_config_json();
  c.erase("mamba_num_heads");
  expect_refused(c, "mamba_num_heads");
  // A depth's layers loom's depth is not (a Mamba mixer; an MLP where the model has experts).
  for (const char* mtp : {"*M", "*-", "E*"}) {
    SCOPED_TRACE(mtp);
    c = nemotron_h_config_json();
    c["num_nextn_predict_layers"] = 1;
    c["mtp_hybrid_override_pattern"] = mtp;
    expect_refused(c, "mtp_hybrid_override_pattern");
  }

  config::ModelConfig m = hybrid_model();
  m.positions = config::Positions::Rope;
  expect_not_exported(m, "model.positions");
  m = hybrid_model();
  m.mtp_depths = 2;  // two depths of their own: a checkpoint holds one depth's weights
  expect_not_exported(m, "model.mtp_depths");
  m = hybrid_model();
  m.activation = config::Activation::Swiglu;
  expect_not_exported(m, "model.activation");
  m = hybrid_model();
  m.moe.router = config::MoeRouter::TopkSoftmax;
  expect_not_exported(m, "model.moe_router");
  m = hybrid_model();
  m.block_configs.assign(4, config::BlockConfig{});
  expect_not_exported(m, "model.block_configs");
}

// Multi-token prediction: loom's depth (mtp.layers.0: enorm, hnorm, eh_proj, a block of attention
// and the model's MoE, final_layernorm) is Nemotron-H's two layers of mtp_hybrid_override_pattern
// "*E", the names written out here: every tensor and the depth's expert bias import exactly; the
// two layers' norms swapped are caught. A repeated depth writes the same one depth.
std::string renamed_mtp(const std::string& name) {
  const std::string prefix = "mtp.layers.0.";
  std::string rest = name.substr(prefix.size());
  auto starts = [&](const char* p) { return rest.rfind(p, 0) == 0; };
  auto swap_prefix = [&](const std::string& from, const std::string& to) { rest = to + rest.substr(from.size()); };
  if (starts("input_layernorm.")) return "mtp.layers.0.norm." + rest.substr(16);
  if (starts("self_attn.")) swap_prefix("self_attn.", "mixer.");
  if (starts("enorm.") || starts("hnorm.") || starts("eh_proj.") || starts("mixer.")) return "mtp.layers.0." + rest;
  if (starts("post_attention_layernorm.")) return "mtp.layers.1.norm." + rest.substr(25);
  if (starts("mlp.")) swap_prefix("mlp.", "mixer.");
  const size_t shared = rest.find(".shared_expert.");
  if (shared != std::string::npos) rest.replace(shared, 15, ".shared_experts.");
  return "mtp.layers.1." + rest;
}

json nemotron_h_mtp_config_json() {
  json c = nemotron_h_config_json();
  c["num_nextn_predict_layers"] = 1;
  c["mtp_hybrid_override_pattern"] = "*E";
  return c;
}

TEST(HfNemotronHMtp, TheDepthImportsFromItsTwoLayers) {
  ckpt::test::TempDir dir;
  config::ModelConfig m = hybrid_model();
  m.mtp_depths = 1;
  model::Transformer reference(m);
  reference.initialize(17);
  // Norm weights start at one: made distinct, so that a norm read into another's place shows.
  for (const model::Parameter& p : reference.params().list()) {
    if (p.name.find("norm.weight") == std::string::npos) continue;
    float* values = reference.params().values() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i) values[i] = 1.0f + 0.01f * static_cast<float>(p.offset % 97 + i);
  }
  ASSERT_EQ(reference.moe_layers().size(), 2u);  // layer 3's and the depth's
  reference.moe_layers().back()->expert_bias() = {-0.3f, 0.1f, 0.4f, -0.2f};
  Tensors tensors = nemotron_h_tensors_of(reference, {"z", "x", "B", "C", "dt"});
  for (auto it = tensors.begin(); it != tensors.end();) {  // the main model's renaming missed the depth
    it = it->first.rfind("mtp.", 0) == 0 ? tensors.erase(it) : std::next(it);
  }
  for (const auto& [name, t] : parameters_of(reference)) {
    if (name.rfind("mtp.", 0) == 0) tensors[renamed_mtp(name)] = t;
  }
  tensors["mtp.layers.1.mixer.gate.e_score_correction_bias"] = {{4}, reference.moe_layers().back()->expert_bias()};
  EXPECT_EQ(tensors.count("mtp.layers.0.mixer.q_proj.weight"), 1u);
  EXPECT_EQ(tensors.count("mtp.layers.1.mixer.shared_experts.up_proj.weight"), 1u);
  EXPECT_EQ(tensors.count("mtp.layers.1.final_layernorm.weight"), 1u);
  const std::string hf = dir / "nemotron-mtp";
  auto imported_difference = [&](const std::string& name, const Tensors& written) {
    write_hf_dir(hf, nemotron_h_mtp_config_json(), written);
    const std::string root = hf + "/" + name;
    HfImportOptions options;
    options.tokenizer = "byte";
    import_from_hf(hf, root, options);
    const ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(root);
    double worst = 0.0;
    Tensors expected = parameters_of(reference);
    expected["state.expert_bias.mtp.layers.0.mlp.gate"] = {{4}, reference.moe_layers().back()->expert_bias()};
    for (const auto& [loom_name, t] : expected) {
      std::vector<float> values(t.values.size());
      checkpoint.read(loom_name, values.data(), DType::F32, t.shape);
      worst = std::max(worst, relative_difference(t.values, values));
    }
    return worst;
  };
  EXPECT_EQ(imported_difference("ok", tensors), 0.0);
  Tensors swapped = tensors;
  std::swap(swapped.at("mtp.layers.0.norm.weight").values, swapped.at("mtp.layers.1.norm.weight").values);
  EXPECT_GT(imported_difference("swapped", swapped), 1e-3);
}

TEST(HfNemotronHMtp, ConfigSaysOneDepthAndItsPattern) {
  config::ModelConfig m = hybrid_model();
  m.mtp_depths = 2;
  m.mtp_use_repeated_layer = true;
  const json c = json::parse(hf_config_json(m, "float32").dump());
  EXPECT_EQ(c.at("num_nextn_predict_layers"), 1);
  EXPECT_EQ(c.at("mtp_hybrid_override_pattern"), "*E");
  const config::ModelConfig back = model_config_from_hf(c, "config.json");
  EXPECT_EQ(back.mtp_depths, 1);  // the weights of one depth: train.init_from it with more depths, repeated
  json listed = c;
  listed.erase("mtp_hybrid_override_pattern");
  listed["mtp_layers_block_type"] = {"attention", "moe"};
  EXPECT_EQ(model_config_from_hf(listed, "config.json").mtp_depths, 1);
  m.moe.experts = 0;
  m.layer_pattern = "M*-";
  m.layers = 3;
  EXPECT_EQ(json::parse(hf_config_json(m, "float32").dump()).at("mtp_hybrid_override_pattern"), "*-");
}

}  // namespace
}  // namespace loom::interop::hf
