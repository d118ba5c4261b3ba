#include "loom/comm/gather_text.h"

#include <cstdint>
#include <cstring>

namespace loom::comm {

std::vector<std::string> gather_text(const std::string& text, Communicator& group, int root) {
  constexpr int kLengthTag = 0, kTextTag = 1;
  if (group.rank() != root) {
    const int64_t length = static_cast<int64_t>(text.size());
    group.send(&length, 1, DType::I64, root, kLengthTag);
    // Bytes travel as 16-bit words (the smallest element type), the last one padded.
    std::vector<uint16_t> words((text.size() + 1) / 2, 0);
    std::memcpy(words.data(), text.data(), text.size());
    group.send(words.data(), static_cast<int64_t>(words.size()), DType::U16, root, kTextTag);
    return {};
  }
  std::vector<std::string> texts(group.size());
  for (int from = 0; from < group.size(); ++from) {
    if (from == root) {
      texts[from] = text;
      continue;
    }
    int64_t length = 0;
    group.recv(&length, 1, DType::I64, from, kLengthTag);
    std::vector<uint16_t> words((length + 1) / 2);
    group.recv(words.data(), static_cast<int64_t>(words.size()), DType::U16, from, kTextTag);
    texts[from].assign(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(length));
  }
  return texts;
}

}  // namespace loom::comm
