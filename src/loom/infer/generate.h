#pragma once
// Text generation from a checkpoint with a KV cache.
#include <cstdint>
#include <ostream>
#include <string>

#include "loom/infer/sampling.h"

namespace loom::infer {

struct GenerateOptions {
  std::string prompt;
  int max_tokens = 100;
  model::SamplingParams sampling;
  uint64_t seed = 0;
  bool stop_at_eot = true;
  std::ostream* notices = nullptr;  // where to say that max_tokens was shortened to fit the context
};

// Loads the checkpoint (a step directory or a root), its config and tokenizer, and returns the
// prompt followed by the generated text. Only ids the tokenizer knows are sampled: a model whose
// vocabulary is padded beyond the tokenizer's (e.g. 50304 for gpt2) never draws a padding id.
std::string generate_text(const std::string& checkpoint, const GenerateOptions& options);

}  // namespace loom::infer
