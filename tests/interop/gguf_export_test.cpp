// GGUF export: the file's layout, refused models and tokenizers, the tiktoken-to-merges rebuild,
// and the export run in llama.cpp (node-llama-cpp's prebuilt binaries, which scripts/setup.sh
// installs) tokenizing and detokenizing prompts as loom does and generating greedily the same
// tokens as loom's own KV-cache decoding, for the byte, gpt2 and a Hugging Face (Llama 3)
// tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../train/training_runs.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/data/hf/components.h"
#include "loom/interop/gguf/gguf_export.h"
#include "loom/interop/gguf/gguf_tokenizer.h"
#include "loom/interop/gguf/tiktoken_merges.h"
#include "loom/train/model_setup.h"
#include "support/test_paths.h"

namespace loom::interop::gguf {
namespace {

namespace t = loom::train::testing;

std::string llama_yaml(const std::string& root, const std::string& tokenizer) {
  // init_std 0.2: logits far apart, so greedy choices are varied and never near ties. The data
  // are byte ids, valid ids of every tokenizer here.
  return "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, "
         "activation: swiglu, positions: rope, tied_embeddings: false, max_seq_len: 64, init_std: 0.2}\n"
         "train: {steps: 2, global_batch: 4, micro_batch: 4}\n"
         "data: {tokenizer: " + tokenizer + ", train_prefix: " + root + "/data/c_train, seq_len: 16}\n";
}

struct Loom {
  std::vector<int32_t> prompt, generated;
  std::string text;  // decode(prompt)
};

// Loom's tokens of each prompt and greedy ids after it from its decode (the reference); the
// checkpoint and tokenizer loaded once for all prompts.
std::vector<Loom> loom_greedy(const std::string& checkpoint_path, const std::vector<std::string>& prompts, int count) {
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config::RunConfig config = config::parse_config(checkpoint.config_yaml(), "manifest", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  const config::ModelConfig m = train::resolve_model_config(config.model, *tokenizer);
  model::Transformer model(m);
  train::load_parameters(checkpoint, model);
  std::vector<Loom> results;
  for (const std::string& prompt : prompts) {
    model::DecodeState state;
    Loom out{tokenizer->encode(prompt), {}, ""};
    out.text = tokenizer->decode(out.prompt);
    const float* logits = model.decode(state, out.prompt.data(), static_cast<int64_t>(out.prompt.size()));
    for (int i = 0; i < count; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits, logits + m.vocab_size) - logits);
      if (next == tokenizer->eot_token()) break;
      out.generated.push_back(next);
      logits = model.decode(state, &next, 1);
    }
    results.push_back(std::move(out));
  }
  return results;
}

// llama.cpp's tokens of each prompt, its detokenization of them and its greedy ids after them:
// one run of the peer for all prompts (starting node and llama.cpp costs seconds).
std::vector<nlohmann::json> llama_cpp_greedy(const std::string& file, const std::vector<std::string>& prompts, int count) {
  const std::string npm = loom::test_paths::source_dir() + "/.cache/npm";
  const std::string script = loom::test_paths::source_dir() + "/tests/interop/gguf_llama_cpp.mjs";
  // scripts/setup.sh installs the peer on every machine: its absence is a setup failure, not a skip.
  if (!std::filesystem::exists(npm + "/node_modules/node-llama-cpp"))
    throw Error("node-llama-cpp is missing under " + npm + ": run scripts/setup.sh");
  const std::string prompts_file = file + ".prompts.json";
  write_file_atomic(prompts_file, nlohmann::json(prompts).dump());
  const std::string command =
      "node " + script + " " + npm + " " + file + " " + prompts_file + " " + std::to_string(count) + " 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw Error("cannot run " + command);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  if (pclose(pipe) != 0) throw Error(command + " failed: " + output);
  const size_t at = output.rfind("[{\"prompt\"");
  if (at == std::string::npos) throw Error(command + " printed no result: " + output);
  const nlohmann::json results = nlohmann::json::parse(output.substr(at));
  if (results.size() != prompts.size())
    throw Error(command + " answered " + std::to_string(results.size()) + " of " + std::to_string(prompts.size()) +
                " prompts: " + output);
  return results.get<std::vector<nlohmann::json>>();
}

// ASCII, punctuation and contractions, runs of spaces and newlines, numbers, and non-ASCII UTF-8.
const std::vector<std::string> kPrompts = {
    "It is a", "Call me Ishmael. Some years ago -- never mind how long precisely!", "It's what they'd say; we've (not) LEFT?",
    "  two  spaces\nand\ttabs\n\n  three\n", "12345 + 678 = 13023, 3.14159", "naïve café — Zürich, 東京, Ελληνικά 🙂!",
    "Spaces before marks , . ? ! and ' s"};
// llama.cpp's detokenizer for its gpt-2 and llama-bpe pre-tokenizers drops the spaces before
// marks and apostrophes (its clean_spaces, fixed per pre-tokenizer); loom's decode keeps them.
const std::string kCleanedByLlamaCpp = "Spaces before marks,.?! and's";

// Trains a Llama-style model with `tokenizer`, exports it, and checks llama.cpp against loom.
void expect_llama_cpp_matches(const std::string& tag, const std::string& tokenizer, bool llama_cpp_cleans_spaces) {
  const std::string root = t::make_training_root(tag);
  t::train_run(root, "llama", llama_yaml(root, tokenizer), {});
  const std::string checkpoint = root + "/llama/checkpoints", file = root + "/model.gguf";
  const GgufExportResult result = export_to_gguf(checkpoint, file, {});
  EXPECT_EQ(result.tensors, 1 + 2 * 9 + 2);
  const std::vector<Loom> loom = loom_greedy(checkpoint, kPrompts, 20);
  const std::vector<nlohmann::json> llama_cpp = llama_cpp_greedy(file, kPrompts, 20);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const std::string& prompt = kPrompts[i];
    const Loom& expected = loom[i];
    const nlohmann::json& got = llama_cpp[i];
    EXPECT_EQ(got.at("prompt").get<std::vector<int32_t>>(), expected.prompt) << tokenizer << ": " << prompt;
    const bool cleaned = llama_cpp_cleans_spaces && prompt == kPrompts.back();
    EXPECT_EQ(got.at("text").get<std::string>(), cleaned ? kCleanedByLlamaCpp : expected.text) << tokenizer << ": " << prompt;
    EXPECT_EQ(expected.text, prompt) << tokenizer;
    EXPECT_EQ(got.at("generated").get<std::vector<int32_t>>(), expected.generated) << tokenizer << ": " << prompt;
  }
  std::filesystem::remove_all(root);
}

TEST(GgufExport, HeaderAndLlamaCppGeneratesTheSameTokens) {
  const std::string root = t::make_training_root("gguf");
  t::train_run(root, "llama", llama_yaml(root, "byte"), {});
  const std::string checkpoint = root + "/llama/checkpoints", file = root + "/model.gguf";
  const GgufExportResult result = export_to_gguf(checkpoint, file, {});
  EXPECT_EQ(result.tensors, 1 + 2 * 9 + 2);
  std::ifstream in(file, std::ios::binary);
  char magic[4];
  uint32_t version = 0;
  uint64_t tensors = 0;
  in.read(magic, 4).read(reinterpret_cast<char*>(&version), 4).read(reinterpret_cast<char*>(&tensors), 8);
  EXPECT_EQ(std::string(magic, 4), "GGUF");
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(tensors, 21u);
  EXPECT_EQ(std::filesystem::file_size(file) % 32, 0u);
  const std::vector<std::string> prompts = {"It is a", "Call me Ishmael", "x"};
  const std::vector<Loom> loom = loom_greedy(checkpoint, prompts, 20);
  const std::vector<nlohmann::json> llama_cpp = llama_cpp_greedy(file, prompts, 20);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string& prompt = prompts[i];
    const Loom& expected = loom[i];
    const nlohmann::json& got = llama_cpp[i];
    EXPECT_EQ(got.at("prompt").get<std::vector<int32_t>>(), expected.prompt) << prompt;
    EXPECT_EQ(got.at("generated").get<std::vector<int32_t>>(), expected.generated) << prompt;
  }
  std::filesystem::remove_all(root);
}

TEST(GgufExport, Gpt2TokenizerTokenizesAndGeneratesAsLoom) { expect_llama_cpp_matches("gguf-gpt2", "gpt2", true); }

TEST(GgufExport, HfLlama3TokenizerTokenizesAndGeneratesAsLoom) {
  expect_llama_cpp_matches("gguf-llama3", "hf:" + data::default_data_dir() + "/hf/llama3", true);
}

TEST(GgufExport, HfQwen3TokenizerTokenizesAndGeneratesAsLoom) {
  expect_llama_cpp_matches("gguf-qwen3", "hf:" + data::default_data_dir() + "/hf/qwen3", false);
}

// The tiktoken encodings past GPT-2's: p50k_base (its <|endoftext|> among the ranks' ids, GPT-2's
// split), cl100k_base (Llama 3's split, llama.cpp's llama-bpe, which also cleans spaces) and
// o200k_base (llama.cpp's gpt-4o, which does not), each with its merges rebuilt from the ranks.
TEST(GgufExport, P50kTokenizerTokenizesAndGeneratesAsLoom) {
  expect_llama_cpp_matches("gguf-p50k", "p50k_base", true);
}

TEST(GgufExport, Cl100kTokenizerTokenizesAndGeneratesAsLoom) {
  expect_llama_cpp_matches("gguf-cl100k", "cl100k_base", true);
}

TEST(GgufExport, O200kTokenizerTokenizesAndGeneratesAsLoom) {
  expect_llama_cpp_matches("gguf-o200k", "o200k_base", false);
}

TEST(GgufExport, MergesRebuiltFromRanks) {
  // Ranks: bytes a b c, then "ab" (a+b), "bc" (b+c), "abc": merging a b c below rank 5 makes
  // "ab" first (rank 3 < 4), so "abc" is ab + c, not a + bc.
  std::vector<std::pair<std::string, std::string>> merges = merges_from_ranks({"a", "b", "c", "ab", "bc", "abc", "cab"});
  const std::vector<std::pair<std::string, std::string>> expected = {{"a", "b"}, {"b", "c"}, {"ab", "c"}, {"c", "ab"}};
  EXPECT_EQ(merges, expected);
  // "bc" ranked before "ab": then "abc" is a + bc.
  merges = merges_from_ranks({"a", "b", "c", "bc", "ab", "abc"});
  EXPECT_EQ(merges.back(), (std::pair<std::string, std::string>{"a", "bc"}));
  // "abc" with no two-part path among the lower ranks (no "ab" nor "bc"): no merge list makes it.
  try {
    merges_from_ranks({"a", "b", "c", "abc"});
    FAIL() << "a token no merge builds was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 3"), std::string::npos) << e.what();
  }
}

TEST(GgufExport, RefusesAPreTokenizerLlamaCppLacks) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("loom-gguf-pre-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 0; c < 256; ++c) vocab[data::hf::byte_level_char(static_cast<unsigned char>(c))] = c;
  const nlohmann::json split = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+|\\s+|."}}}, {"behavior", "Isolated"}, {"invert", false}};
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  const nlohmann::json spec = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                               {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {split, byte_level}}}},
                               {"decoder", {{"type", "ByteLevel"}}}};
  // The Split regex llama.cpp lacks, no pre-tokenizer at all, and a Sequence with a null step.
  nlohmann::json without = spec, null_step = spec;
  without.erase("pre_tokenizer");
  null_step["pre_tokenizer"]["pretokenizers"][0] = nullptr;
  for (const nlohmann::json& refused : {spec, without, null_step}) {
    write_file_atomic((dir / "tokenizer.json").string(), refused.dump());
    const std::string name = "hf:" + dir.string();
    auto tokenizer = data::make_tokenizer(name);
    GgufWriter w;
    try {
      add_tokenizer(w, 256, name, *tokenizer);
      ADD_FAILURE() << "an unknown pre-tokenizer was exported: "
                    << refused.value("pre_tokenizer", nlohmann::json()).dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tokenizer.json: pre_tokenizer"), std::string::npos) << e.what();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufExport, ATokenizerJsonWithoutMergesIsExportedAsItLoads) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom-gguf-merges-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 0; c < 256; ++c) vocab[data::hf::byte_level_char(static_cast<unsigned char>(c))] = c;
  const nlohmann::json spec = {
      // No "merges" (none) and null flags (false), for the tokenizer and the export alike.
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"ignore_merges", nullptr}, {"byte_fallback", nullptr}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  write_file_atomic((dir / "tokenizer.json").string(), spec.dump());
  const std::string name = "hf:" + dir.string();
  auto tokenizer = data::make_tokenizer(name);
  GgufWriter w;
  EXPECT_NO_THROW(add_tokenizer(w, 256, name, *tokenizer));
  std::filesystem::remove_all(dir);
}

TEST(GgufExport, RefusesOtherTokenizersNamingTheKey) {
  auto expect_refused = [](const std::string& name, const std::string& key) {
    auto tokenizer = data::make_tokenizer(name);
    GgufWriter w;
    try {
      add_tokenizer(w, tokenizer->vocab_size(), name, *tokenizer);
      ADD_FAILURE() << name << " was exported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  // Llama 2's SentencePiece-converted tokenizer.json (byte fallback, Metaspace-style normalizer).
  expect_refused("hf:" + data::default_data_dir() + "/hf/llama2", "model.byte_fallback");
}

// Trains a model (`model`: the body of its YAML map) on bytes, exports it, checks the file's
// llama.cpp architecture and tensor count, and that llama.cpp generates greedily the same 30
// tokens as loom's decoding after each prompt.
void expect_export_generates_as_loom(const std::string& tag, const std::string& architecture, const std::string& model,
                                     int64_t tensors, const std::string& dtype = "f32") {
  const std::string root = t::make_training_root(tag);
  const std::string yaml = "model: {" + model + "}\ntrain: {steps: 3, global_batch: 4, micro_batch: 4}\n" +
                           "data: {tokenizer: byte, train_prefix: " + root + "/data/c_train, seq_len: 16}\n";
  t::train_run(root, "model", yaml, {});
  const std::string checkpoint = root + "/model/checkpoints", file = root + "/model.gguf";
  const GgufExportResult result = export_to_gguf(checkpoint, file, {dtype});
  EXPECT_EQ(result.tensors, tensors) << tag;
  EXPECT_EQ(result.architecture, architecture) << tag;
  const std::vector<std::string> prompts = {"It is a", "Call me Ishmael. Some years", "x"};
  const std::vector<Loom> loom = loom_greedy(checkpoint, prompts, 30);
  const std::vector<nlohmann::json> llama_cpp = llama_cpp_greedy(file, prompts, 30);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(llama_cpp[i].at("prompt").get<std::vector<int32_t>>(), loom[i].prompt) << tag << ": " << prompts[i];
    EXPECT_EQ(llama_cpp[i].at("generated").get<std::vector<int32_t>>(), loom[i].generated) << tag << ": " << prompts[i];
  }
  std::filesystem::remove_all(root);
}

// Heterogeneous layers (model.block_configs, as Llama-3.3-Nemotron-Super's) go out as llama.cpp's
// `deci` architecture, with a head count, kv-head count and ffn size per layer (0 where a layer
// skips attention or its MLP), and Llama 3.1's scaled RoPE as the `rope_freqs` factors; llama.cpp
// then generates greedily the same tokens as loom's decoding. A context of 64 positions over an
// original 16 puts the scaling to work in every prompt.
TEST(GgufExport, HeterogeneousLayersAndLlama3RopeRunAsLlamaCppsDeci) {
  // embeddings, rope_freqs, 3 attention blocks of 5, 4 MLPs of 4, output norm and head
  expect_export_generates_as_loom(
      "gguf-deci", "deci",
      "vocab_size: 0, d_model: 32, layers: 5, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu, "
      "positions: rope, tied_embeddings: false, max_seq_len: 64, init_std: 0.2, rope_scaling: llama3, "
      "rope_scaling_factor: 4.0, rope_original_max_positions: 16, rope_theta: 500.0, "
      "block_configs: [{kv_heads: 4, ffn_size: 32}, {attention: skip, ffn_size: 64}, {kv_heads: 1}, "
      "{attention: skip, ffn_size: 0}, {ffn_size: 16}]",
      1 + 1 + 3 * 5 + 4 * 4 + 2);
}

// A mixture of experts in every layer (Mixtral's) goes out as llama.cpp's `llama` with experts:
// the router as `ffn_gate_inp`, each projection's experts stacked into one `*_exps` tensor, and
// `expert_count` / `expert_used_count`; llama.cpp routes as loom's topk_softmax (a softmax over
// all logits renormalised over the k best) and generates greedily the same tokens.
TEST(GgufExport, MixtureOfExpertsRunsAsLlamaCppsLlama) {
  // per layer: attention 5, the MoE's norm, router and 3 stacks
  expect_export_generates_as_loom(
      "gguf-moe", "llama",
      "vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu, "
      "positions: rope, tied_embeddings: false, max_seq_len: 64, init_std: 0.2, moe_experts: 4, moe_top_k: 2, "
      "moe_ffn_size: 24",
      1 + 2 * (5 + 5) + 2);
}

// Qwen 2's q/k/v biases go out as llama.cpp's `qwen2` (its NeoX rope rotates loom's half-split
// pairs: no row interleaving), and with experts as its `qwen2moe`: a softmax over every expert
// with the k best weights as they are (softmax_topk), and a shared expert scaled by the sigmoid of
// its gate; tied embeddings, which qwen2moe takes as an output of their own.
TEST(GgufExport, Qwen2AndQwen2MoeRunAsLlamaCppsQwen2) {
  const std::string qwen2 =
      "vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu, "
      "positions: rope, rope_theta: 1000000.0, qkv_bias: true, tied_embeddings: true, max_seq_len: 64, "
      "init_std: 0.2";
  // per layer: attention 5 and its 3 biases, the MLP's 4
  expect_export_generates_as_loom("gguf-qwen2", "qwen2", qwen2, 1 + 2 * (8 + 4) + 1);
  // per layer: attention 8, the MoE's norm, router, 3 stacks, the shared expert's gate and 3
  expect_export_generates_as_loom("gguf-qwen2-moe", "qwen2moe",
                                  qwen2 + ", moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16, moe_router: softmax_topk, "
                                          "moe_shared_ffn_size: 24, moe_shared_expert_gate: true",
                                  1 + 2 * (8 + 9) + 2);
}

// Nemotron-H hybrids go out as llama.cpp's `nemotron_h`, whose Mamba-2 convolution, scan and gated
// norm, attention without positions and squared-ReLU MLPs then generate as loom's decoding does:
// Nemotron-H's layers (Mamba-2, attention, MLP), and Nemotron 3 Super's (Mamba-2, attention and a
// latent MoE with sigmoid routing, a shared expert, a trained expert bias and scaled weights).
TEST(GgufExport, NemotronHHybridsRunAsLlamaCppsNemotronH) {
  // embeddings; a Mamba-2 layer 9 tensors, attention 5, an MLP 3; output norm and head
  const std::string hybrid =
      "vocab_size: 0, d_model: 32, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: relu2, positions: none, "
      "tied_embeddings: false, max_seq_len: 64, init_std: 0.2, layers: 4, "
      "mamba: {state_size: 8, heads: 4, head_dim: 16, groups: 2, conv_kernel: 4, chunk_size: 8}, ";
  const std::string nemotron_h = hybrid + "layer_pattern: 'M*-M'";
  expect_export_generates_as_loom("gguf-nemotron-h", "nemotron_h", nemotron_h, 1 + 9 + 5 + 3 + 9 + 2);
  expect_export_generates_as_loom("gguf-nemotron-h-f16", "nemotron_h", nemotron_h, 1 + 9 + 5 + 3 + 9 + 2, "f16");
  // a MoE layer: norm, router, its bias, the latent projections, the shared expert, the experts' stacks
  expect_export_generates_as_loom("gguf-nemotron-h-moe", "nemotron_h",
                                  hybrid + "layer_pattern: 'M*ME', moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16, "
                                           "moe_latent_size: 16, moe_shared_ffn_size: 24, moe_router: sigmoid, "
                                           "moe_expert_bias: true, moe_bias_update_rate: 0.05, moe_topk_scaling: 1.5",
                                  1 + 9 + 5 + 9 + 9 + 2);
}

// A model's multi-token prediction depths have no place in the file: the export says so.
TEST(GgufExport, SaysTheMtpDepthsAreLeftOut) {
  const std::string root = t::make_training_root("gguf-mtp");
  t::train_run(root, "mtp", llama_yaml(root, "byte"), {"model.mtp_depths=1"});
  const GgufExportResult with = export_to_gguf(root + "/mtp/checkpoints", root + "/mtp.gguf", {});
  EXPECT_EQ(with.architecture, "llama");
  EXPECT_EQ(with.tensors, 1 + 2 * 9 + 2);
  EXPECT_NE(with.note.find("model.mtp_depths = 1"), std::string::npos) << with.note;
  t::train_run(root, "plain", llama_yaml(root, "byte"), {});
  EXPECT_EQ(export_to_gguf(root + "/plain/checkpoints", root + "/plain.gguf", {}).note, "");
  std::filesystem::remove_all(root);
}

// What llama.cpp's `llama` and `deci` cannot run is refused by its key, and no file is written.
TEST(GgufExport, RefusesLayersLlamaCppsDeciCannotRun) {
  const std::string root = t::make_training_root("gguf-deci-refused");
  const std::string model = "vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 32, max_seq_len: 32";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"block_configs: [{}, {ffn_size: 0}]", "model.block_configs[1].ffn_size is 0 with attention"},
      {"block_configs: [{attention: skip}, {}]", "model.block_configs[0].attention is skip"},
      {"moe_experts: 4, moe_router: sigmoid", "model.moe_router is sigmoid"},
      {"moe_experts: 4, moe_shared_ffn_size: 16", "model.moe_shared_ffn_size is 16"},
      {"moe_experts: 4, block_configs: [{ffn: moe}, {ffn: dense}]", "model.block_configs[0].ffn is moe"},
      {"rope_scaling: yarn, rope_scaling_factor: 2.0", "model.rope_scaling is yarn"},
      {"qkv_bias: true, moe_experts: 4, moe_shared_ffn_size: 16, moe_shared_expert_gate: true",
       "model.moe_router is topk_softmax"},
      {"layer_pattern: '-E', activation: relu2, positions: none, moe_experts: 4, moe_router: sigmoid, "
       "moe_shared_ffn_size: 16",
       "model.layer_pattern is '-E'"},
      {"layer_pattern: 'M*', activation: relu2, mamba: {heads: 2, head_dim: 16, chunk_size: 8}", "model.positions"},
  };
  int run = 0;
  for (const auto& [keys, expected] : refused) {
    const std::string name = "refused-" + std::to_string(++run);
    const std::string train = "train: {steps: 1, global_batch: 2, micro_batch: 2}\n";
    t::train_run(root, name, "model: {" + model + ", " + keys + "}\n" + train + t::data_section(root), {});
    try {
      export_to_gguf(root + "/" + name + "/checkpoints", root + "/x.gguf", {});
      ADD_FAILURE() << keys << " was exported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(root + "/x.gguf")) << keys;
  }
  std::filesystem::remove_all(root);
}

TEST(GgufExport, RefusesWhatLlamaCppsLlamaCannotRun) {
  const std::string root = t::make_training_root("gguf-refused");
  t::train_run(root, "gpt2", "model: {d_model: 32, layers: 1, heads: 2, ffn_size: 32, norm: layer, activation: gelu, "
                              "positions: learned, max_seq_len: 32}\ntrain: {steps: 1, global_batch: 2, micro_batch: 2}\n" +
                                  t::data_section(root), {});
  try {
    export_to_gguf(root + "/gpt2/checkpoints", root + "/x.gguf", {});
    FAIL() << "a GPT-2-style model was exported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(root + "/x.gguf"));
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace loom::interop::gguf
