#pragma once
// Byte-level BPE as OpenAI's tiktoken defines it: text is split into pieces by the encoding's
// regex (PCRE2, UTF + Unicode properties, JIT), each piece's bytes are merged pairwise, always
// the pair of lowest rank first (leftmost on ties), and the ranks of the final parts are the ids.
// Ranks come from a `.tiktoken` file (base64 token bytes, space, rank per line) whose sha256
// must match the published one.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/data/tokenizer.h"

namespace loom::data {

struct SpecialToken {
  std::string_view text;
  int32_t id;
};

// The published definition of one encoding (tiktoken_ext/openai_public.py).
struct BpeEncoding {
  std::string_view name;
  std::string_view rank_file;  // under <data_dir>/gpt-tokenizer/
  std::string_view sha256;     // of the rank file, hex
  std::string_view pattern;    // how text is split into pieces before merging
  std::vector<SpecialToken> specials;
  int32_t vocab_size;          // ranks + specials + unused ids between them
};

// `pattern` with \s and \S spelled out as Unicode White_Space, the class Rust's regex and
// Oniguruma mean by them (PCRE2's \s also takes U+180E).
std::string spell_out_white_space(std::string_view pattern);

// The encoding called `name` (gpt2 is another name of r50k_base), or nullptr.
const BpeEncoding* find_bpe_encoding(std::string_view name);
// Names find_bpe_encoding accepts.
std::vector<std::string> bpe_encoding_names();

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads <data_dir>/gpt-tokenizer/<rank_file>; throws loom::Error naming the file when it is
  // missing, has another sha256 or is malformed.
  BpeTokenizer(const BpeEncoding& encoding, const std::string& data_dir);
  ~BpeTokenizer() override;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return encoding_.vocab_size; }
  int32_t eot_token() const override { return eot_; }
  std::string name() const override { return std::string(encoding_.name); }
  std::optional<int32_t> special_token_id(std::string_view text) const override;

  // The published definition it was made from (its specials, its vocabulary size).
  const BpeEncoding& encoding() const { return encoding_; }
  // The bytes of the mergeable rank `id`, or nullopt for a special token's id or an unused one
  // between the ranks and the specials.
  std::optional<std::string_view> rank_bytes(int32_t id) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Splitter;  // the compiled split pattern (PCRE2), kept out of this header

  // Pieces of one encode call that took merging -> where their ids first went in the output.
  using MergeMemo = std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>>;

  int32_t rank_of(std::string_view bytes) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, MergeMemo& memo) const;
  void load_ranks(const std::string& path);

  BpeEncoding encoding_;
  int32_t eot_ = -1;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;
  std::vector<std::string> token_bytes_;  // by id: what decode emits
  std::vector<bool> id_used_;             // false for ids between the ranks and the specials
  std::unique_ptr<Splitter> splitter_;
};

}  // namespace loom::data
