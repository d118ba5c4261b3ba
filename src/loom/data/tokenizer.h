#pragma once
// Tokenizers: byte-level (ids 0..255) and tiktoken-style byte-level BPE loaded from `.tiktoken`
// rank files (r50k_base = GPT-2, cl100k_base, o200k_base).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

// The environment's LOOM_DATA_DIR when set, else the build's (LOOM_DATA_DIR: <repo>/.cache/data).
std::string default_data_dir();

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ordinary text: special-token strings are encoded as plain text.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t vocab_size() const = 0;  // including special tokens
  virtual int32_t eot_token() const = 0;   // <|endoftext|> (byte tokenizer: 0)
  virtual std::string name() const = 0;
};

// name: byte | gpt2 | r50k_base | p50k_base | p50k_edit | cl100k_base | o200k_base (gpt2 is
// r50k_base; name() reports the encoding, so both say "r50k_base"). `data_dir` holds the verified
// downloads (default LOOM_DATA_DIR); rank files are checked against their sha256. encode and
// decode are safe to call from many threads at once.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir = default_data_dir());

// The names make_tokenizer accepts: loom::known_tokenizer_names() (core/tokenizer_names.h).
std::vector<std::string> tokenizer_names();

}  // namespace loom::data
