#pragma once
// Byte tokenizer: token id = byte value (0..255), vocab 256. There is no room for a separate
// end-of-text token, so eot_token() is 0, the NUL byte, which text corpora do not contain.
#include "loom/data/tokenizer.h"

namespace loom::data {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return 256; }
  int32_t eot_token() const override { return 0; }
  std::string name() const override { return "byte"; }
};

}  // namespace loom::data
