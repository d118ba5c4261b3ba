// Qwen2-MoE from Hugging Face: a hand-written config.json (Qwen2MoeConfig's keys, dense layers by
// mlp_only_layers and decoder_sparse_step) and safetensors holding a loom model's weights under
// Qwen2MoeForCausalLM's names import to a model whose logits equal that model's; a flipped
// norm_topk_prob or swapped expert projections are caught; config.json round-trips.
#include <gtest/gtest.h>

#include "hf_config_expect.h"
#include "hf_import_support.h"
#include "loom/core/error.h"
#include "loom/interop/hf/hf_config.h"
#include "../ckpt/ckpt_test_util.h"

namespace loom::interop::hf {
namespace {

using nlohmann::json;
using namespace testing;

// Layers 0 and 2 dense, layer 1 sparse, as decoder_sparse_step 2 with mlp_only_layers [] gives.
config::ModelConfig qwen2_moe_model(config::MoeRouter router) {
  config::ModelConfig m;
  m.vocab_size = 256;
  m.d_model = 16;
  m.layers = 3;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_size = 24;
  m.max_seq_len = 32;
  m.tied_embeddings = false;
  m.qkv_bias = true;
  m.norm_eps = 1e-6;
  m.init_std = 0.3;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.ffn_size = 8;
  m.moe.shared_ffn_size = 12;
  m.moe.shared_expert_gate = true;
  m.moe.router = router;
  m.block_configs.assign(3, config::BlockConfig{});
  m.block_configs[0].ffn = config::BlockFfn::Dense;
  m.block_configs[2].ffn = config::BlockFfn::Dense;
  return m;
}

// config.json as Qwen's releases write it, by hand (not by loom's writer).
json qwen2_moe_config_json(bool norm_topk_prob) {
  return json{{"architectures", {"Qwen2MoeForCausalLM"}},
              {"model_type", "qwen2_moe"},
              {"hidden_size", 16},
              {"intermediate_size", 24},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 256},
              {"max_position_embeddings", 32},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 10000.0},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false},
              {"use_sliding_window", false},
              {"sliding_window", 4096},
              {"max_window_layers", 28},
              {"num_experts", 4},
              {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 8},
              {"shared_expert_intermediate_size", 12},
              {"norm_topk_prob", norm_topk_prob},
              {"decoder_sparse_step", 2},
              {"mlp_only_layers", json::array()},
              {"router_aux_loss_coef", 0.001},
              {"output_router_logits", false},
              {"torch_dtype", "float32"}};
}

const std::vector<int32_t> kTokens = {3, 200, 17, 17, 90, 41, 255, 0};

TEST(HfQwen2MoeImport, LogitsEqualTheModelWhoseWeightsWereWritten) {
  ckpt::test::TempDir dir;
  for (const bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "norm_topk_prob" : "no norm_topk_prob");
    const config::ModelConfig m =
        qwen2_moe_model(norm ? config::MoeRouter::TopkSoftmax : config::MoeRouter::SoftmaxTopk);
    model::Transformer reference(m);
    reference.initialize(11);
    const std::vector<float> expected = decode_logits(reference, kTokens);
    Tensors tensors = parameters_of(reference);  // Qwen2-MoE's names are loom's
    ASSERT_TRUE(tensors.count("model.layers.1.mlp.shared_expert_gate.weight"));
    ASSERT_TRUE(tensors.count("model.layers.1.mlp.experts.3.down_proj.weight"));
    ASSERT_TRUE(tensors.count("model.layers.0.mlp.gate_proj.weight"));  // dense
    ASSERT_TRUE(tensors.count("model.layers.1.self_attn.q_proj.bias"));
    const std::string hf = dir / (norm ? "norm" : "plain");
    write_hf_dir(hf, qwen2_moe_config_json(norm), tensors);
    EXPECT_LE(relative_difference(expected, imported_logits(hf, "ok", kTokens)), 1e-6);

    // The test can fail: the other routing, and the experts' gate and up projections swapped.
    write_hf_dir(hf, qwen2_moe_config_json(!norm), tensors);
    EXPECT_GT(relative_difference(expected, imported_logits(hf, "flipped", kTokens)), 1e-3);
    Tensors swapped = tensors;
    for (int e = 0; e < 4; ++e) {
      const std::string at = "model.layers.1.mlp.experts." + std::to_string(e);
      std::swap(swapped[at + ".gate_proj.weight"], swapped[at + ".up_proj.weight"]);
    }
    write_hf_dir(hf, qwen2_moe_config_json(norm), swapped);
    EXPECT_GT(relative_difference(expected, imported_logits(hf, "swapped", kTokens)), 1e-3);
  }
}

TEST(HfQwen2MoeConfig, WritesAndReadsBack) {
  config::ModelConfig m = qwen2_moe_model(config::MoeRouter::SoftmaxTopk);
  m.moe.aux_loss_coeff = 0.01;
  const json c = json::parse(hf_config_json(m, "float32").dump());
  EXPECT_EQ(c.at("architectures"), json::array({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(c.at("model_type"), "qwen2_moe");
  EXPECT_EQ(c.at("num_experts"), 4);
  EXPECT_EQ(c.at("moe_intermediate_size"), 8);
  EXPECT_EQ(c.at("shared_expert_intermediate_size"), 12);
  EXPECT_EQ(c.at("intermediate_size"), 24);
  EXPECT_EQ(c.at("norm_topk_prob"), false);
  EXPECT_EQ(c.at("mlp_only_layers"), json::array({0, 2}));
  EXPECT_FALSE(c.contains("attention_bias"));
  const config::ModelConfig back = model_config_from_hf(c, "config.json");
  EXPECT_EQ(back.moe.router, config::MoeRouter::SoftmaxTopk);
  EXPECT_TRUE(back.moe.shared_expert_gate);
  EXPECT_EQ(back.moe.shared_ffn_size, 12);
  EXPECT_EQ(back.moe.aux_loss_coeff, 0.01);
  ASSERT_EQ(back.block_configs.size(), 3u);
  EXPECT_EQ(back.block_configs[0].ffn, config::BlockFfn::Dense);
  EXPECT_EQ(back.block_configs[1].ffn, config::BlockFfn::Moe);
  EXPECT_EQ(back.block_configs[2].ffn, config::BlockFfn::Dense);
  EXPECT_TRUE(back.qkv_bias);
  // Every layer sparse: no block_configs; absent optional keys take Qwen2MoeConfig's defaults.
  json all = qwen2_moe_config_json(true);
  for (const char* key : {"decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef",
                          "rms_norm_eps", "rope_theta", "use_sliding_window"})
    all.erase(key);
  const config::ModelConfig dense = model_config_from_hf(all, "config.json");
  EXPECT_TRUE(dense.block_configs.empty());
  EXPECT_EQ(dense.moe.router, config::MoeRouter::SoftmaxTopk);  // norm_topk_prob defaults to false
  EXPECT_EQ(dense.moe.aux_loss_coeff, 0.001);
}

TEST(HfQwen2MoeConfig, RefusesWhatLoomCannotComputeNamingTheKey) {
  json c = qwen2_moe_config_json(true);
  c["use_sliding_window"] = true;
  expect_refused(c, "use_sliding_window");
  c = qwen2_moe_config_json(true);
  c["mlp_only_layers"] = json::array({5});
  expect_refused(c, "mlp_only_layers");
  c = qwen2_moe_config_json(true);
  c["decoder_sparse_step"] = 0;
  expect_refused(c, "decoder_sparse_step");
  c = qwen2_moe_config_json(true);
  c.erase("shared_expert_intermediate_size");
  expect_refused(c, "shared_expert_intermediate_size");
  c = qwen2_moe_config_json(true);
  c["num_experts_per_tok"] = 9;
  expect_refused(c, "num_experts_per_tok");
  c = qwen2_moe_config_json(true);
  c["qkv_bias"] = false;
  expect_refused(c, "qkv_bias");

  config::ModelConfig m = qwen2_moe_model(config::MoeRouter::TopkSoftmax);
  m.moe.shared_expert_gate = false;
  expect_not_exported(m, "model.moe_shared_expert_gate");
  m = qwen2_moe_model(config::MoeRouter::Sigmoid);
  expect_not_exported(m, "model.moe_router");
  m = qwen2_moe_model(config::MoeRouter::TopkSoftmax);
  m.moe.latent_size = 8;
  expect_not_exported(m, "model.moe_latent_size");
  m = qwen2_moe_model(config::MoeRouter::TopkSoftmax);
  m.block_configs[0].ffn_size = 32;
  expect_not_exported(m, "model.block_configs[0].ffn_size");
  m = qwen2_moe_model(config::MoeRouter::TopkSoftmax);
  m.qkv_bias = false;
  expect_not_exported(m, "model.qkv_bias");
}

}  // namespace
}  // namespace loom::interop::hf
