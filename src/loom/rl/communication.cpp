#include "loom/rl/communication.h"

#include <algorithm>
#include <bit>
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

int64_t max_over_group(comm::Communicator& group, int64_t value) {
  if (group.size() == 1) return value;
  std::vector<int64_t> values(static_cast<size_t>(group.size()));
  group.all_gather(&value, values.data(), 1, DType::I64);
  return *std::max_element(values.begin(), values.end());
}

void sum_samples_over_group(comm::Communicator& group, std::vector<double>& sums) {
  if (group.size() == 1 || sums.empty()) return;
  const size_t n = sums.size();
  std::vector<int64_t> mine(n), all(n * static_cast<size_t>(group.size()));
  for (size_t i = 0; i < n; ++i) mine[i] = std::bit_cast<int64_t>(sums[i]);
  group.all_gather(mine.data(), all.data(), static_cast<int64_t>(n), DType::I64);
  std::fill(sums.begin(), sums.end(), 0.0);
  for (int r = 0; r < group.size(); ++r) {
    for (size_t i = 0; i < n; ++i) sums[i] += std::bit_cast<double>(all[static_cast<size_t>(r) * n + i]);
  }
}

}  // namespace loom::rl
