#pragma once
// Text generation from a checkpoint with a KV cache.
#include <cstdint>
#include <string>

#include "loom/infer/sampling.h"

namespace loom::infer {

struct GenerateOptions {
  std::string prompt;
  int max_tokens = 100;
  model::SamplingParams sampling;
  uint64_t seed = 0;
  bool stop_at_eot = true;
};

// Loads the checkpoint (a step directory or a root), its config and tokenizer, and returns the
// prompt followed by the generated text.
std::string generate_text(const std::string& checkpoint, const GenerateOptions& options);

}  // namespace loom::infer
