#include "loom/rl/communication.h"

#include <cstring>
#include <vector>

namespace loom::rl {

std::string broadcast_text(const std::string& text, comm::Communicator& group, int root) {
  int64_t bytes = group.rank() == root ? static_cast<int64_t>(text.size()) : 0;
  group.broadcast(&bytes, 1, DType::I64, root);
  // Bytes travel as whole i32 words (the communication layer has no byte type).
  std::vector<int32_t> words(static_cast<size_t>((bytes + 3) / 4), 0);
  if (group.rank() == root && bytes > 0) std::memcpy(words.data(), text.data(), static_cast<size_t>(bytes));
  if (!words.empty()) group.broadcast(words.data(), static_cast<int64_t>(words.size()), DType::I32, root);
  return std::string(reinterpret_cast<const char*>(words.data()), static_cast<size_t>(bytes));
}

}  // namespace loom::rl
