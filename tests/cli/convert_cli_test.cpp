// End-to-end `loom convert`: loom -> Hugging Face -> loom keeps the parameter digest and the
// generated text for a Llama-style and a heterogeneous (DeciLM) model, the converted checkpoint
// resumes training, config.json holds the Hugging Face fields, and bad inputs fail naming the
// key, tensor or file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "loom/interop/hf/safetensors.h"
#include "loom/core/atomic_file.h"

namespace loom::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ConvertCli : public ::testing::Test {
 protected:
  void SetUp() override {
    CommandResult prepared = prepare_small_corpus(dir.path(), 200, 0.2);
    ASSERT_EQ(prepared.exit_code, 0) << prepared.output;
  }

  // A run config for `model` (YAML lines under model:), trained 3 steps.
  std::string write_config(const std::string& name, const std::string& model) {
    const std::string path = dir / (name + ".yaml");
    write_text(path, "run:\n  dir: " + (dir / name) + "\n"
                     "model:\n  vocab_size: 0\n  d_model: 32\n  heads: 4\n  max_seq_len: 64\n" + model +
                     "data:\n  tokenizer: byte\n  train_prefix: " + (dir / "data/c_train") + "\n  seq_len: 32\n"
                     "optim:\n  lr: 3.0e-3\n"
                     "train:\n  steps: 3\n  global_batch: 4\n  micro_batch: 2\n  threads: 1\n");
    return path;
  }

  void train(const std::string& config, const std::string& overrides = "") {
    CommandResult run = run_loom("train " + config + " " + overrides);
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }

  std::string digest(const std::string& path) { return last_line(run_loom("ckpt digest " + path).output); }
  std::string generate(const std::string& path) {
    CommandResult r = run_loom("generate " + path + " --prompt 'Call me' --max-tokens 16 --temperature 0");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  }
  json read_json(const std::string& path) { return json::parse(read_file(path)); }
  std::string write_messages() {
    const std::string path = dir / "messages.json";
    write_text(path, R"([{"role": "user", "content": "Hi"}])");
    return path;
  }

  // Converts run `name`'s checkpoints to HF and back; expects the same digest and text.
  void expect_round_trip(const std::string& name) {
    const std::string original = dir / (name + "/checkpoints");
    CommandResult to = run_loom("convert --to-hf " + original + " " + (dir / (name + "-hf")));
    ASSERT_EQ(to.exit_code, 0) << to.output;
    EXPECT_NE(to.output.find("optimizer state is not exported"), std::string::npos) << to.output;
    CommandResult from = run_loom("convert --from-hf " + (dir / (name + "-hf")) + " " + (dir / (name + "-back")));
    ASSERT_EQ(from.exit_code, 0) << from.output;
    EXPECT_NE(from.output.find("tokenizer byte"), std::string::npos) << from.output;
    const std::string before = digest(original);
    ASSERT_EQ(before.size(), 32u);
    EXPECT_EQ(digest(dir / (name + "-back")), before);
    EXPECT_EQ(generate(dir / (name + "-back")), generate(original));
  }

  TempDir dir;
};

TEST_F(ConvertCli, FromHfBringsTheModelsTokenizerAlong) {
  train(write_config("tok", "  layers: 1\n  kv_heads: 2\n  ffn_size: 64\n"));
  const std::string hf = dir / "tok-hf";
  ASSERT_EQ(run_loom("convert --to-hf " + (dir / "tok/checkpoints") + " " + hf).exit_code, 0);
  // A character-level tokenizer.json of 96 ids (printable ASCII and <unk>) with a chat template.
  json vocab = json::object({{"<unk>", 0}});
  for (int c = 32; c < 127; ++c) vocab[std::string(1, static_cast<char>(c))] = c - 31;
  write_text(hf + "/tokenizer.json",
             json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"unk_token", "<unk>"}}}}.dump());
  write_text(hf + "/tokenizer_config.json",
             json{{"eos_token", "~"}, {"chat_template", "{% for m in messages %}{{ m.role }}: {{ m.content }}~{% endfor %}"}}.dump());
  CommandResult from = run_loom("convert --from-hf " + hf + " " + (dir / "tok-back"));
  ASSERT_EQ(from.exit_code, 0) << from.output;
  const std::string tokenizer_dir = fs::absolute(dir / "tok-back/tokenizer").string();
  EXPECT_NE(from.output.find("tokenizer hf:" + tokenizer_dir), std::string::npos) << from.output;
  EXPECT_EQ(read_file(tokenizer_dir + "/tokenizer.json"), read_file(hf + "/tokenizer.json"));
  CommandResult chat = run_loom("tokenize --tokenizer hf:" + tokenizer_dir + " --chat --text " + write_messages());
  EXPECT_EQ(chat.output, "user: Hi~");
  generate(dir / "tok-back");  // generation decodes with the imported tokenizer
  // --to-hf of a run with an hf: tokenizer writes its files beside config.json.
  ASSERT_EQ(run_loom("convert --to-hf " + (dir / "tok-back") + " " + (dir / "tok-hf2")).exit_code, 0);
  EXPECT_TRUE(fs::is_regular_file(dir / "tok-hf2/tokenizer_config.json"));
}

TEST_F(ConvertCli, LlamaRoundTripKeepsTheDigestTextAndResumes) {
  const std::string config = write_config("llama", "  layers: 2\n  kv_heads: 2\n  ffn_size: 64\n");
  train(config);
  expect_round_trip("llama");

  const json c = read_json(dir / "llama-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c.at("hidden_size"), 32);
  EXPECT_EQ(c.at("intermediate_size"), 64);
  EXPECT_EQ(c.at("num_hidden_layers"), 2);
  EXPECT_EQ(c.at("num_attention_heads"), 4);
  EXPECT_EQ(c.at("num_key_value_heads"), 2);
  EXPECT_EQ(c.at("vocab_size"), 256);  // the byte tokenizer's, resolved from vocab_size: 0
  EXPECT_EQ(c.at("max_position_embeddings"), 64);
  EXPECT_EQ(c.at("rms_norm_eps"), 1e-5);
  EXPECT_EQ(c.at("rope_theta"), 10000.0);
  EXPECT_EQ(c.at("tie_word_embeddings"), true);
  EXPECT_EQ(c.at("hidden_act"), "silu");
  EXPECT_EQ(c.at("torch_dtype"), "float32");

  // Parameters only, by their Hugging Face names; the tied head is not repeated.
  const loom::interop::hf::SafetensorsReader weights(dir / "llama-hf/model.safetensors");
  EXPECT_EQ(weights.header().metadata.at("format"), "pt");
  EXPECT_NE(weights.header().find("model.embed_tokens.weight"), nullptr);
  EXPECT_NE(weights.header().find("model.layers.1.mlp.up_proj.weight"), nullptr);
  EXPECT_EQ(weights.header().find("lm_head.weight"), nullptr);
  for (const loom::interop::hf::SafetensorsTensor& t : weights.header().tensors) {
    EXPECT_EQ(t.name.rfind("optim.", 0), std::string::npos) << t.name;
    EXPECT_EQ(t.dtype, "F32");
  }
  EXPECT_EQ(weights.header().tensors.size(), 2u + 2u * 9u);  // embedding, final norm; 9 per layer

  // The converted checkpoint resumes training (zero optimizer moments, step 0).
  CommandResult resumed = run_loom("train " + config + " checkpoint.dir=" + (dir / "llama-back") +
                                   " train.resume=true train.steps=2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step 0"), std::string::npos) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "llama-back/step-00000002"));
}

TEST_F(ConvertCli, MixtureOfExpertsRoundTripsAsMixtral) {
  train(write_config("moe", "  layers: 2\n  kv_heads: 2\n  ffn_size: 64\n  moe_experts: 4\n  moe_top_k: 2\n"
                            "  moe_ffn_size: 24\n  moe_aux_loss_coeff: 0.01\n"));
  expect_round_trip("moe");
  const json c = read_json(dir / "moe-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"MixtralForCausalLM"}));
  EXPECT_EQ(c.at("num_local_experts"), 4);
  EXPECT_EQ(c.at("num_experts_per_tok"), 2);
  EXPECT_EQ(c.at("intermediate_size"), 24);
  // A shared expert exports as Qwen2-MoE, whose shared expert is gated: an ungated one is refused
  // naming the key.
  train(write_config("shared", "  layers: 1\n  moe_experts: 4\n  moe_shared_ffn_size: 16\n"));
  CommandResult to = run_loom("convert --to-hf " + (dir / "shared/checkpoints") + " " + (dir / "shared-hf"));
  EXPECT_NE(to.exit_code, 0);
  EXPECT_NE(to.output.find("model.moe_shared_expert_gate"), std::string::npos) << to.output;
}

// Qwen2-MoE: q/k/v biases, a gated shared expert, softmax-then-top-k routing and a dense layer
// (mlp_only_layers) round-trip with the same digest and text.
TEST_F(ConvertCli, Qwen2MoeRoundTripKeepsTheDigest) {
  train(write_config("qwen-moe", "  layers: 3\n  kv_heads: 2\n  ffn_size: 48\n  tied_embeddings: false\n"
                                 "  qkv_bias: true\n  moe_experts: 4\n  moe_top_k: 2\n  moe_ffn_size: 16\n"
                                 "  moe_shared_ffn_size: 24\n  moe_shared_expert_gate: true\n"
                                 "  moe_router: softmax_topk\n  block_configs: [{ffn: dense}, {}, {ffn: moe}]\n"));
  expect_round_trip("qwen-moe");
  const json c = read_json(dir / "qwen-moe-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"Qwen2MoeForCausalLM"}));
  EXPECT_EQ(c.at("mlp_only_layers"), json::array({0}));
  EXPECT_EQ(c.at("norm_topk_prob"), false);
  const loom::interop::hf::SafetensorsReader weights(dir / "qwen-moe-hf/model.safetensors");
  EXPECT_NE(weights.header().find("model.layers.1.mlp.shared_expert_gate.weight"), nullptr);
  EXPECT_NE(weights.header().find("model.layers.2.mlp.experts.3.up_proj.weight"), nullptr);
  EXPECT_NE(weights.header().find("model.layers.0.mlp.down_proj.weight"), nullptr);
}

// A hybrid model (Mamba-2, attention without positions, squared-ReLU MLP, latent MoE with a
// trained expert bias, a repeated multi-token prediction depth) exports as NemotronHForCausalLM and
// back with the same digest and text.
TEST_F(ConvertCli, NemotronHRoundTripKeepsTheDigestAndTheExpertBias) {
  train(write_config("hybrid", "  layers: 4\n  layer_pattern: \"M*-E\"\n  kv_heads: 2\n  ffn_size: 48\n"
                               "  activation: relu2\n  positions: none\n  tied_embeddings: false\n"
                               "  mtp_depths: 2\n  mtp_use_repeated_layer: true\n"
                               "  moe_experts: 4\n  moe_top_k: 2\n  moe_ffn_size: 16\n  moe_shared_ffn_size: 24\n"
                               "  moe_latent_size: 16\n  moe_router: sigmoid\n  moe_expert_bias: true\n"
                               "  moe_bias_update_rate: 0.05\n"
                               "  mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 16}\n"));
  expect_round_trip("hybrid");
  const json c = read_json(dir / "hybrid-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"NemotronHForCausalLM"}));
  EXPECT_EQ(c.at("hybrid_override_pattern"), "M*-E");
  const loom::interop::hf::SafetensorsReader weights(dir / "hybrid-hf/model.safetensors");
  const auto* in_proj = weights.header().find("backbone.layers.0.mixer.in_proj.weight");
  ASSERT_NE(in_proj, nullptr);
  EXPECT_EQ(in_proj->shape, (std::vector<uint64_t>{2 * 32 + 2 * 2 * 8 + 4, 32}));
  EXPECT_EQ(weights.header().find("backbone.layers.0.mixer.conv1d.weight")->shape,
            (std::vector<uint64_t>{32 + 2 * 2 * 8, 1, 4}));
  EXPECT_NE(weights.header().find("backbone.layers.3.mixer.shared_experts.up_proj.weight"), nullptr);
  EXPECT_NE(weights.header().find("backbone.layers.2.norm.weight"), nullptr);
  EXPECT_EQ(c.at("num_nextn_predict_layers"), 1);
  EXPECT_EQ(c.at("mtp_hybrid_override_pattern"), "*E");
  for (const char* name :
       {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.mixer.o_proj.weight", "mtp.layers.1.norm.weight",
        "mtp.layers.1.mixer.experts.3.down_proj.weight", "mtp.layers.1.final_layernorm.weight",
        "mtp.layers.1.mixer.gate.e_score_correction_bias"}) {
    EXPECT_NE(weights.header().find(name), nullptr) << name;
  }
  // The trained expert bias travels as the router's e_score_correction_bias.
  const auto* bias = weights.header().find("backbone.layers.3.mixer.gate.e_score_correction_bias");
  ASSERT_NE(bias, nullptr);
  std::vector<float> values(4);
  weights.read(*bias, std::as_writable_bytes(std::span(values)));
  EXPECT_GT(std::abs(values[0]) + std::abs(values[1]) + std::abs(values[2]) + std::abs(values[3]), 0.0f);
}

TEST_F(ConvertCli, HeterogeneousRoundTripWritesDeciLMBlockConfigs) {
  train(write_config("hetero", "  layers: 3\n  kv_heads: 2\n  ffn_size: 64\n  tied_embeddings: false\n"
                               "  block_configs: [{}, {attention: skip, ffn_size: 256}, {kv_heads: 1, ffn_size: 0}]\n"));
  expect_round_trip("hetero");
  const json c = read_json(dir / "hetero-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"DeciLMForCausalLM"}));
  EXPECT_EQ(c.at("tie_word_embeddings"), false);
  const json& b = c.at("block_configs");
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].at("attention").at("n_heads_in_group"), 2);
  EXPECT_EQ(b[0].at("ffn").at("intermediate_size"), 64);
  EXPECT_EQ(b[1].at("attention").at("no_op"), true);
  EXPECT_EQ(b[1].at("ffn").at("ffn_mult"), 12.0);
  EXPECT_EQ(b[2].at("attention").at("n_heads_in_group"), 4);
  EXPECT_EQ(b[2].at("ffn").at("no_op"), true);
  const loom::interop::hf::SafetensorsReader weights(dir / "hetero-hf/model.safetensors");
  EXPECT_NE(weights.header().find("lm_head.weight"), nullptr);
  EXPECT_EQ(weights.header().find("model.layers.1.input_layernorm.weight"), nullptr);  // no attention
  EXPECT_EQ(weights.header().find("model.layers.2.mlp.up_proj.weight"), nullptr);      // no MLP
}

// Qwen2's q/k/v biases (model.qkv_bias) with Llama 3.1 RoPE scaling round-trip; the exported
// config.json then loses every optional key and still converts as transformers reads it.
TEST_F(ConvertCli, Qwen2BiasesAndRopeScalingRoundTrip) {
  train(write_config("qwen", "  layers: 2\n  kv_heads: 2\n  ffn_size: 64\n  tied_embeddings: false\n"
                             "  qkv_bias: true\n  rope_scaling: llama3\n  rope_scaling_factor: 8\n"
                             "  rope_original_max_positions: 16\n"));
  expect_round_trip("qwen");
  json c = read_json(dir / "qwen-hf/config.json");
  EXPECT_EQ(c.at("architectures"), json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(c.at("rope_scaling").at("rope_type"), "llama3");
  EXPECT_EQ(c.at("rope_scaling").at("original_max_position_embeddings"), 16);
  const loom::interop::hf::SafetensorsReader weights(dir / "qwen-hf/model.safetensors");
  EXPECT_NE(weights.header().find("model.layers.0.self_attn.k_proj.bias"), nullptr);
  EXPECT_EQ(weights.header().find("model.layers.0.self_attn.o_proj.bias"), nullptr);

  // Absent optional keys default as transformers' Qwen2Config does; none of them is an error.
  for (const char* key : {"rope_scaling", "rope_theta", "tie_word_embeddings", "rms_norm_eps", "num_key_value_heads",
                          "hidden_act", "initializer_range", "head_dim", "use_sliding_window", "sliding_window",
                          "torch_dtype", "use_cache", "attention_dropout"})
    c.erase(key);
  c["num_key_value_heads"] = 2;  // Qwen2Config's default would be num_attention_heads
  write_text(dir / "qwen-hf/config.json", c.dump());
  CommandResult from = run_loom("convert --from-hf " + (dir / "qwen-hf") + " " + (dir / "qwen-bare"));
  ASSERT_EQ(from.exit_code, 0) << from.output;
  c["rope_theta"] = "fast";
  write_text(dir / "qwen-hf/config.json", c.dump());
  from = run_loom("convert --from-hf " + (dir / "qwen-hf") + " " + (dir / "qwen-bad"));
  EXPECT_NE(from.exit_code, 0);
  EXPECT_NE(from.output.find("qwen-hf/config.json: rope_theta is \"fast\"; expected a positive number"),
            std::string::npos) << from.output;
}

// A scaled-down Llama-3.3-Nemotron-Super config.json as NVIDIA ships it (DeciLM block options,
// Llama 3.1 RoPE scaling) with random weights named by hand after DeciLM's modelling code:
// imports, exports and imports again to the same parameters.
TEST_F(ConvertCli, DeciLMWithLlama3RopeScalingRoundTrips) {
  const std::string hf = dir / "deci-hf";
  fs::create_directories(hf);
  auto block = [](json attention, json ffn) {
    attention["replace_with_linear"] = false;
    attention["sparsify"] = nullptr;
    attention["num_sinks"] = nullptr;
    attention["window_length"] = nullptr;
    ffn["replace_with_linear"] = false;
    ffn["sparsify"] = nullptr;
    return json{{"attention", attention}, {"ffn", ffn}};
  };
  const json config = {
      {"architectures", {"DeciLMForCausalLM"}}, {"model_type", "nemotron-nas"}, {"hidden_size", 64},
      {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", nullptr},
      {"intermediate_size", nullptr}, {"vocab_size", 256}, {"max_position_embeddings", 64},
      {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0}, {"hidden_act", "silu"}, {"tie_word_embeddings", false},
      {"attention_bias", false}, {"mlp_bias", false}, {"torch_dtype", "bfloat16"}, {"bos_token_id", 1},
      {"rope_scaling", {{"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                        {"original_max_position_embeddings", 16}, {"rope_type", "llama3"}}},
      {"block_configs",
       {block({{"no_op", false}, {"n_heads_in_group", 2}}, {{"no_op", false}, {"ffn_mult", 2.625}}),   // ffn 256
        block({{"no_op", true}, {"n_heads_in_group", nullptr}}, {{"no_op", false}, {"ffn_mult", 9.0}}),  // 512
        block({{"no_op", false}, {"n_heads_in_group", 4}}, {{"no_op", true}, {"ffn_mult", nullptr}})}}};
  write_text(hf + "/config.json", config.dump(2));
  std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes = {
      {"model.embed_tokens.weight", {256, 64}}, {"model.norm.weight", {64}}, {"lm_head.weight", {256, 64}}};
  const int kv_heads[] = {2, 0, 1}, ffn[] = {256, 512, 0};
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (kv_heads[l] > 0) {
      shapes.push_back({p + "input_layernorm.weight", {64}});
      shapes.push_back({p + "self_attn.q_proj.weight", {64, 64}});
      shapes.push_back({p + "self_attn.k_proj.weight", {uint64_t(16 * kv_heads[l]), 64}});
      shapes.push_back({p + "self_attn.v_proj.weight", {uint64_t(16 * kv_heads[l]), 64}});
      shapes.push_back({p + "self_attn.o_proj.weight", {64, 64}});
    }
    if (ffn[l] > 0) {
      shapes.push_back({p + "post_attention_layernorm.weight", {64}});
      shapes.push_back({p + "mlp.gate_proj.weight", {uint64_t(ffn[l]), 64}});
      shapes.push_back({p + "mlp.up_proj.weight", {uint64_t(ffn[l]), 64}});
      shapes.push_back({p + "mlp.down_proj.weight", {64, uint64_t(ffn[l])}});
    }
  }
  std::vector<loom::interop::hf::SafetensorsOutput> tensors;
  for (const auto& [name, shape] : shapes) {
    tensors.push_back({name, "F32", shape, [seed = tensors.size()](std::span<std::byte> out) {
                         std::mt19937 rng(static_cast<uint32_t>(seed));
                         std::normal_distribution<float> normal(0.0f, 0.05f);
                         for (size_t i = 0; i + 4 <= out.size(); i += 4) {
                           const float v = normal(rng);
                           std::memcpy(out.data() + i, &v, 4);
                         }
                       }});
  }
  loom::interop::hf::write_safetensors(hf + "/model.safetensors", tensors, {{"format", "pt"}});
  CommandResult from = run_loom("convert --from-hf " + hf + " " + (dir / "deci"));
  ASSERT_EQ(from.exit_code, 0) << from.output;
  CommandResult to = run_loom("convert --to-hf " + (dir / "deci") + " " + (dir / "deci-hf2"));
  ASSERT_EQ(to.exit_code, 0) << to.output;
  const json back = read_json(dir / "deci-hf2/config.json");
  EXPECT_EQ(back.at("rope_scaling"), config.at("rope_scaling"));
  // 9.0 and 12.0 both give 512 under DeciLM's rule; loom writes the exact 3 * 512 / (2 * 64).
  EXPECT_EQ(back.at("block_configs")[1].at("ffn").at("ffn_mult"), 12.0);
  CommandResult again = run_loom("convert --from-hf " + (dir / "deci-hf2") + " " + (dir / "deci-again"));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(digest(dir / "deci-again"), digest(dir / "deci"));
  EXPECT_EQ(digest(dir / "deci").size(), 32u);
  generate(dir / "deci");
}

TEST_F(ConvertCli, Bf16ExportAndShardedImport) {
  train(write_config("llama", "  layers: 2\n  ffn_size: 64\n"));
  const std::string original = dir / "llama/checkpoints";
  CommandResult bf16 = run_loom("convert --to-hf " + original + " " + (dir / "bf16") + " --dtype bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  EXPECT_EQ(read_json(dir / "bf16/config.json").at("torch_dtype"), "bfloat16");
  const loom::interop::hf::SafetensorsReader bf16_weights(dir / "bf16/model.safetensors");
  for (const loom::interop::hf::SafetensorsTensor& t : bf16_weights.header().tensors) {
    EXPECT_EQ(t.dtype, "BF16") << t.name;
  }
  CommandResult back = run_loom("convert --from-hf " + (dir / "bf16") + " " + (dir / "bf16-back"));
  ASSERT_EQ(back.exit_code, 0) << back.output;
  EXPECT_NE(digest(dir / "bf16-back"), digest(original));  // rounded to bf16
  generate(dir / "bf16-back");

  // The f32 export split into two shards with model.safetensors.index.json reads back exactly.
  ASSERT_EQ(run_loom("convert --to-hf " + original + " " + (dir / "hf")).exit_code, 0);
  const loom::interop::hf::SafetensorsReader whole(dir / "hf/model.safetensors");
  fs::create_directories(dir / "sharded");
  fs::copy_file(dir / "hf/config.json", dir / "sharded/config.json");
  std::vector<loom::interop::hf::SafetensorsOutput> shards[2];
  json weight_map = json::object();
  for (size_t i = 0; i < whole.header().tensors.size(); ++i) {
    const loom::interop::hf::SafetensorsTensor& t = whole.header().tensors[i];
    const std::string file = i % 2 == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    weight_map[t.name] = file;
    shards[i % 2].push_back({t.name, t.dtype, t.shape, [&whole, &t](std::span<std::byte> out) { whole.read(t, out); }});
  }
  loom::interop::hf::write_safetensors(dir / "sharded/model-00001-of-00002.safetensors", shards[0], {{"format", "pt"}});
  loom::interop::hf::write_safetensors(dir / "sharded/model-00002-of-00002.safetensors", shards[1], {{"format", "pt"}});
  write_text(dir / "sharded/model.safetensors.index.json", json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump());
  CommandResult sharded = run_loom("convert --from-hf " + (dir / "sharded") + " " + (dir / "sharded-back"));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  EXPECT_EQ(digest(dir / "sharded-back"), digest(original));

  // An index pointing outside the directory is refused.
  write_text(dir / "sharded/model.safetensors.index.json",
             json{{"weight_map", {{"model.norm.weight", "../hf/model.safetensors"}}}}.dump());
  CommandResult escaped = run_loom("convert --from-hf " + (dir / "sharded") + " " + (dir / "escaped"));
  EXPECT_NE(escaped.exit_code, 0);
  EXPECT_NE(escaped.output.find("is not a file name in"), std::string::npos) << escaped.output;
}

void expect_clear_failure(const CommandResult& result, std::initializer_list<std::string> mentions) {
  EXPECT_NE(result.exit_code, 0) << result.output;
  for (const std::string& m : mentions) {
    EXPECT_NE(result.output.find(m), std::string::npos) << "missing '" << m << "' in:\n" << result.output;
  }
}

TEST_F(ConvertCli, BadInputsFailNamingTheKeyTensorOrFile) {
  // A GPT-2 style model has no Llama form.
  train(write_config("gpt2", "  layers: 1\n  ffn_size: 64\n  norm: layer\n  activation: gelu\n  positions: learned\n"
                             "  bias: true\n"));
  expect_clear_failure(run_loom("convert --to-hf " + (dir / "gpt2/checkpoints") + " " + (dir / "gpt2-hf")),
                       {"model.norm is 'layer'", "Llama-style"});
  EXPECT_FALSE(fs::exists(dir / "gpt2-hf/model.safetensors"));

  train(write_config("llama", "  layers: 2\n  ffn_size: 64\n"));
  const std::string hf = dir / "hf";
  ASSERT_EQ(run_loom("convert --to-hf " + (dir / "llama/checkpoints") + " " + hf).exit_code, 0);
  expect_clear_failure(run_loom("convert " + hf + " " + (dir / "x")), {"--to-hf or --from-hf"});
  expect_clear_failure(run_loom("convert --to-hf --from-hf " + hf + " " + (dir / "x")), {"excludes"});
  expect_clear_failure(run_loom("convert --from-hf " + hf + " " + (dir / "llama")), {"already exists", "llama"});
  expect_clear_failure(run_loom("convert --from-hf " + hf + " " + (dir / "x") + " --tokenizer klingon"),
                       {"data.tokenizer", "klingon"});

  // A tensor missing from the weights.
  const std::string broken = dir / "broken";
  fs::create_directories(broken);
  fs::copy_file(hf + "/config.json", broken + "/config.json");
  {
    const loom::interop::hf::SafetensorsReader whole(hf + "/model.safetensors");
    std::vector<loom::interop::hf::SafetensorsOutput> kept;
    for (const loom::interop::hf::SafetensorsTensor& t : whole.header().tensors) {
      if (t.name == "model.layers.1.mlp.down_proj.weight") continue;
      kept.push_back({t.name, t.dtype, t.shape, [&whole, &t](std::span<std::byte> out) { whole.read(t, out); }});
    }
    loom::interop::hf::write_safetensors(broken + "/model.safetensors", kept, {});
  }
  expect_clear_failure(run_loom("convert --from-hf " + broken + " " + (dir / "x")),
                       {"no tensor 'model.layers.1.mlp.down_proj.weight'", "[32, 64]"});
  EXPECT_FALSE(fs::exists(dir / "x"));

  // A config.json that does not match the weights: the first misshapen tensor is named.
  json config = json::parse(read_file(hf + "/config.json"));
  config["intermediate_size"] = 48;
  fs::copy_file(hf + "/model.safetensors", broken + "/model.safetensors", fs::copy_options::overwrite_existing);
  write_text(broken + "/config.json", config.dump());
  expect_clear_failure(run_loom("convert --from-hf " + broken + " " + (dir / "x")),
                       {"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 32]", "[48, 32]"});
  config["intermediate_size"] = 64;
  config["rope_scaling"] = {{"rope_type", "yarn"}};
  write_text(broken + "/config.json", config.dump());
  expect_clear_failure(run_loom("convert --from-hf " + broken + " " + (dir / "x")), {"config.json: rope_scaling"});

  // A truncated or corrupt model.safetensors.
  write_text(broken + "/config.json", read_file(hf + "/config.json"));
  const std::string bytes = read_file(hf + "/model.safetensors");
  write_text(broken + "/model.safetensors", bytes.substr(0, bytes.size() - 100));
  expect_clear_failure(run_loom("convert --from-hf " + broken + " " + (dir / "x")),
                       {"broken/model.safetensors: tensor", "reach past the data section", "truncated"});
  write_text(broken + "/model.safetensors", bytes.substr(0, 5));
  expect_clear_failure(run_loom("convert --from-hf " + broken + " " + (dir / "x")), {"model.safetensors: file is 5 bytes"});
  expect_clear_failure(run_loom("convert --from-hf " + (dir / "nowhere") + " " + (dir / "x")), {"nowhere"});
}

}  // namespace
}  // namespace loom::testing
