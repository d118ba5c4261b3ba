#pragma once
// Text generation from a checkpoint with a KV cache.
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/data/tokenizer.h"
#include "loom/infer/inference_device.h"
#include "loom/infer/penalties.h"
#include "loom/infer/sampling.h"
#include "loom/model/transformer.h"

namespace loom::infer {

class Engine;

struct GenerateOptions {
  std::string prompt;
  int max_tokens = 100;
  model::SamplingParams sampling;
  Penalties penalties;              // presence, frequency and repetition penalties (penalties.h), as loom serve's
  uint64_t seed = 0;
  bool stop_at_eot = true;
  bool parse_special = false;       // special-token text in the prompt becomes their ids (a rendered chat)
  std::string stop;                 // stop when the generated text ends with this (not returned); empty: never
  std::ostream* notices = nullptr;  // where to say that max_tokens was shortened to fit the context
  config::RuntimeDevice device = config::RuntimeDevice::Cpu;  // where the model runs (generate_text)
  InferenceDtype dtype = InferenceDtype::Auto;                // its linear GEMMs (generate_text)
  int speculative_tokens = 0;  // drafts a step from the model's multi-token prediction depths (generate_text)
};

// A checkpoint's model (a step directory or a root), its config and tokenizer, loaded once to
// generate many continuations.
class Generator {
 public:
  // `device`: cuda puts the weights, the KV cache and every step's forward on GPU 0 (the logits come
  // back to the host, where sampling runs). `dtype`: the linear GEMMs' format, as `loom serve
  // --dtype` (inference_device.h; auto: bf16 on cuda, fp32 on the cpu); the KV cache stays fp32.
  // `speculative_tokens` > 0: each step drafts that many tokens with the model's multi-token
  // prediction depths and verifies them in the next forward (loom serve's engine, engine.h, with
  // one sequence and a KV cache for the whole context): greedy output is the same text; sampled
  // text is distributed as without drafts but drawn from the engine's streams of the seed
  // (speculative.h), so a seed gives another text than without drafts.
  explicit Generator(const std::string& checkpoint, config::RuntimeDevice device = config::RuntimeDevice::Cpu,
                     InferenceDtype dtype = InferenceDtype::Auto, int speculative_tokens = 0);
  ~Generator();
  // The generated text (without the prompt). Only ids the tokenizer knows are sampled: a model
  // whose vocabulary is padded beyond the tokenizer's (e.g. 50304 for gpt2) never draws a padding id.
  std::string continue_text(const GenerateOptions& options);
  const config::RunConfig& config() const { return config_; }
  const data::Tokenizer& tokenizer() const { return *tokenizer_; }
  // With speculative_tokens: the tokens drafted so far and how many of them were kept.
  struct Drafts {
    int64_t drafted = 0, kept = 0;
  };
  Drafts drafts() const;

 private:
  std::string continue_with_drafts(const std::vector<int32_t>& prompt, int64_t budget, const GenerateOptions& options);

  config::RunConfig config_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  std::unique_ptr<model::Transformer> model_;  // without drafts
  std::unique_ptr<Engine> engine_;             // with them
};

// The prompt followed by the generated text.
std::string generate_text(const std::string& checkpoint, const GenerateOptions& options);

}  // namespace loom::infer
