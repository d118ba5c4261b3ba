#pragma once
// Shared by the inference tests: four tiny checkpoints (a Llama-style model with heterogeneous
// layers, a GPT-2-style one, a Llama-style one with MoE layers, a hybrid one with Mamba-2,
// attention, MLP and MoE layers) trained for two steps, and running requests through an engine.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../train/training_runs.h"
#include "loom/ckpt/checkpoint.h"
#include "loom/config/run_config.h"
#include "loom/infer/engine.h"
#include "loom/kernels/types.h"
#include "loom/train/model_setup.h"

namespace loom::infer::testing {

inline const std::string& llama_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
      "        positions: rope, tied_embeddings: false, max_seq_len: 64,\n"
      "        block_configs: [{attention: normal}, {attention: normal, kv_heads: 1, ffn_size: 64},\n"
      "                        {attention: skip}, {attention: normal, kv_heads: 4, ffn_size: 0}]}\n"
      "optim: {lr: 3.0e-3}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 7}\n";
  return yaml;
}

inline const std::string& gpt2_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, norm: layer, activation: gelu,\n"
      "        positions: learned, bias: true, tied_embeddings: true, max_seq_len: 64}\n"
      "optim: {lr: 3.0e-3}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 9}\n";
  return yaml;
}

// A Llama-style model whose MLPs are latent MoE layers with a shared expert (sigmoid router).
inline const std::string& moe_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
      "        positions: rope, tied_embeddings: false, max_seq_len: 64, moe_experts: 4, moe_top_k: 2,\n"
      "        moe_ffn_size: 24, moe_shared_ffn_size: 16, moe_latent_size: 16, moe_router: sigmoid}\n"
      "optim: {lr: 3.0e-3}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 5}\n";
  return yaml;
}

// A hybrid model (Nemotron-H's alphabet): Mamba-2 mixers, attention, a squared-ReLU MLP and a
// latent MoE; 4 Mamba heads in 2 groups split over tp 2.
inline const std::string& hybrid_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 5, layer_pattern: 'M*EM-', heads: 4, kv_heads: 2, ffn_size: 48,\n"
      "        norm: rms, activation: relu2, positions: rope, tied_embeddings: false, max_seq_len: 64,\n"
      "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_latent_size: 16, moe_shared_ffn_size: 16,\n"
      "        moe_router: sigmoid,\n"
      "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}\n"
      "optim: {lr: 3.0e-3}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 11}\n";
  return yaml;
}

// A Llama-style model with heads of 64 (the head_dim a GPU attends to prompt rows on tensor cores
// with, kernels::paged_prompt_attention) and room for prompts of several 64-row tiles.
inline const std::string& llama64_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 256, layers: 2, heads: 4, kv_heads: 2, ffn_size: 96, norm: rms,\n"
      "        activation: swiglu, positions: rope, tied_embeddings: false, max_seq_len: 192}\n"
      "optim: {lr: 3.0e-3}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 4, seed: 13}\n";
  return yaml;
}

// Models with multi-token prediction, trained long enough (60 steps) that their depths' drafts
// are often right: a Llama-style one with 3 depths, a GPT-2-style one with 2, and a hybrid one
// (Mamba-2, attention, latent MoE; its depth attention plus a MoE) with one depth's weights at 2
// depths, as Nemotron 3 Super.
inline const std::string& llama_mtp_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, norm: rms, activation: swiglu,\n"
      "        positions: rope, tied_embeddings: false, max_seq_len: 64, mtp_depths: 3, mtp_loss_weight: 0.5}\n"
      "optim: {lr: 1.0e-2}\n"
      "train: {steps: 60, global_batch: 8, micro_batch: 8, seed: 17}\n";
  return yaml;
}
inline const std::string& gpt2_mtp_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, ffn_size: 64, norm: layer, activation: gelu,\n"
      "        positions: learned, bias: true, tied_embeddings: true, max_seq_len: 64, mtp_depths: 2}\n"
      "optim: {lr: 1.0e-2}\n"
      "train: {steps: 60, global_batch: 8, micro_batch: 8, seed: 19}\n";
  return yaml;
}
inline const std::string& hybrid_mtp_yaml() {
  static const std::string yaml =
      "model: {vocab_size: 0, d_model: 32, layers: 4, layer_pattern: 'M*EM', heads: 4, kv_heads: 2, ffn_size: 48,\n"
      "        norm: rms, activation: relu2, positions: rope, tied_embeddings: false, max_seq_len: 64,\n"
      "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_latent_size: 16, moe_shared_ffn_size: 16,\n"
      "        moe_router: sigmoid, mtp_depths: 2, mtp_use_repeated_layer: true,\n"
      "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}\n"
      "optim: {lr: 1.0e-2}\n"
      "train: {steps: 60, global_batch: 8, micro_batch: 8, seed: 23}\n";
  return yaml;
}

// Trains each model once per test binary; returns the checkpoint root of `name` (llama | gpt2 | moe | hybrid |
// llama64 | llama_mtp | gpt2_mtp | hybrid_mtp).
inline std::string checkpoint_of(const std::string& name) {
  static std::map<std::string, std::string> made;
  if (made.count(name) != 0) return made[name];
  static const std::string root = loom::train::testing::make_training_root("infer");
  const std::string& model = name == "llama"    ? llama_yaml()
                             : name == "moe"    ? moe_yaml()
                             : name == "hybrid" ? hybrid_yaml()
                             : name == "llama64" ? llama64_yaml()
                             : name == "llama_mtp" ? llama_mtp_yaml()
                             : name == "gpt2_mtp" ? gpt2_mtp_yaml()
                             : name == "hybrid_mtp" ? hybrid_mtp_yaml()
                                                : gpt2_yaml();
  const std::string yaml = model + loom::train::testing::data_section(root);
  loom::train::testing::train_run(root, name, yaml, {});
  return made[name] = root + "/" + name + "/checkpoints";
}

// A checkpoint's model on one rank, its linear GEMMs in `precision`'s recipe (fp32 by default).
inline std::unique_ptr<model::Transformer> load_model(const std::string& checkpoint_path,
                                                      const model::PrecisionPolicy& precision = {}) {
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config::RunConfig config = config::parse_config(checkpoint.config_yaml(), "manifest", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  auto model = std::make_unique<model::Transformer>(train::resolve_model_config(config.model, *tokenizer),
                                                    model::TensorParallel{}, precision);
  train::load_parameters(checkpoint, *model);
  return model;
}

// The log-probability of each completion token from one forward over prompt + completion (the
// training path; fp32 unless `precision` says otherwise).
inline std::vector<float> full_forward_logprobs(const std::string& checkpoint_path, const std::vector<int32_t>& prompt,
                                                const std::vector<int32_t>& completion,
                                                const model::PrecisionPolicy& precision = {}) {
  std::unique_ptr<model::Transformer> loaded = load_model(checkpoint_path, precision);
  model::Transformer& model = *loaded;
  std::vector<int32_t> inputs = prompt;
  inputs.insert(inputs.end(), completion.begin(), completion.end() - 1);
  std::vector<float> out;
  for (size_t j = 0; j < completion.size(); ++j) {
    std::vector<int32_t> targets(inputs.size(), kernels::kIgnoreIndex);
    targets[prompt.size() - 1 + j] = completion[j];
    out.push_back(static_cast<float>(-model.forward_loss(inputs.data(), targets.data(), 1, static_cast<int64_t>(inputs.size()))));
  }
  return out;
}

struct Completion {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text, finish_reason;
};

// Appends a stream's pending events to its completions (by sample index), waiting up to `wait` for some.
inline void drain_stream(RequestStream& stream, std::vector<Completion>& out,
                         std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
  for (SampleEvent& e : stream.pop(wait)) {
    Completion& c = out[e.index];
    c.tokens.insert(c.tokens.end(), e.tokens.begin(), e.tokens.end());
    for (const TokenLogprobs& lp : e.logprobs) c.logprobs.push_back(lp.logprob);
    c.text += e.text;
    if (!e.finish_reason.empty()) c.finish_reason = e.finish_reason;
  }
}

// Runs every request to the end by stepping the engine here; result[request][sample].
inline std::vector<std::vector<Completion>> run_all(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                                    const RequestOptions& options) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) streams.push_back(engine.submit(p, options));
  std::vector<std::vector<Completion>> out(prompts.size(), std::vector<Completion>(options.n));
  auto drain = [&] {
    for (size_t r = 0; r < streams.size(); ++r) drain_stream(*streams[r], out[r]);
  };
  while (engine.step()) drain();
  drain();
  for (auto& s : streams) EXPECT_TRUE(s->done());
  return out;
}

inline RequestOptions greedy(int64_t max_tokens) {
  RequestOptions o;
  o.sampling.temperature = 0.0;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

// Byte prompts of the given lengths (distinct text).
inline std::vector<std::vector<int32_t>> prompts_of(const std::vector<int>& lengths) {
  const std::string text = "It is a truth universally acknowledged, that a single man in possession of a good fortune";
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<int32_t> p;
    for (int k = 0; k < lengths[i]; ++k) p.push_back(static_cast<unsigned char>(text[(k + 3 * i) % text.size()]));
    prompts.push_back(p);
  }
  return prompts;
}

inline void expect_same(const Completion& a, const Completion& b, const std::string& what) {
  ASSERT_EQ(a.tokens, b.tokens) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  for (size_t i = 0; i < a.logprobs.size(); ++i) {
    EXPECT_NEAR(a.logprobs[i], b.logprobs[i], 1e-5 * std::max(1.0f, std::abs(b.logprobs[i]))) << what << " token " << i;
  }
}

}  // namespace loom::infer::testing
