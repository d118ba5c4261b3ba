#include "loom/data/tokenizer.h"

#include <cstdlib>

#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"
#include "loom/data/bpe_tokenizer.h"
#include "loom/data/byte_tokenizer.h"

namespace loom::data {

std::vector<std::string> tokenizer_names() {
  return known_tokenizer_names();
}

std::string default_data_dir() {
  const char* from_env = std::getenv("LOOM_DATA_DIR");
  return from_env != nullptr && *from_env != '\0' ? from_env : LOOM_DATA_DIR;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name, const std::string& data_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (const BpeEncoding* encoding = find_bpe_encoding(name))
    return std::make_unique<BpeTokenizer>(*encoding, data_dir);
  std::string valid;
  for (const std::string& n : tokenizer_names()) valid += (valid.empty() ? "" : ", ") + n;
  throw Error("unknown tokenizer '" + name + "'; valid names: " + valid);
}

}  // namespace loom::data
