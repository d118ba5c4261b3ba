#pragma once
// The tokenizer of an export as GGUF `tokenizer.ggml.*` metadata that makes llama.cpp tokenize
// and detokenize as loom does: loom's byte tokenizer (256 byte symbols, no merges), gpt2
// (r50k_base: tokens and merges rebuilt from the tiktoken ranks, pre-tokenizer "gpt-2"), and
// hf:<dir> byte-level BPE tokenizer.json files whose pre-tokenizer llama.cpp has ("gpt-2",
// "llama-bpe", "qwen2"). Anything else is refused, naming the key.
#include <cstdint>
#include <string>

#include "loom/data/tokenizer.h"
#include "loom/interop/gguf/gguf_writer.h"

namespace loom::interop::gguf {

// `name`: the run's data.tokenizer; `tokenizer`: make_tokenizer(name); ids from the tokenizer's
// vocabulary up to `vocab_size` (model.vocab_size, which may pad it) are written as unused.
void add_tokenizer(GgufWriter& w, int64_t vocab_size, const std::string& name, const data::Tokenizer& tokenizer);

}  // namespace loom::interop::gguf
