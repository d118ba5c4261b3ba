#include "loom/data/byte_tokenizer.h"

#include "loom/core/error.h"

namespace loom::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > 255)
      throw Error("byte tokenizer: cannot decode id " + std::to_string(ids[i]) + " at position " +
                  std::to_string(i) + "; valid ids are 0..255");
    out[i] = static_cast<char>(ids[i]);
  }
  return out;
}

}  // namespace loom::data
