#include "loom/interop/gguf/tiktoken_merges.h"

#include <cstdint>
#include <unordered_map>

#include "loom/core/error.h"

namespace loom::interop::gguf {

namespace {
// Merges `bytes` pairwise, lowest rank first (leftmost on ties), using only ranks below `limit`.
std::vector<std::string> merge_below(const std::string& bytes, int64_t limit,
                                     const std::unordered_map<std::string, int64_t>& ranks) {
  std::vector<std::string> parts;
  for (char c : bytes) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int64_t best = limit;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == limit) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return parts;
}
}  // namespace

std::vector<std::pair<std::string, std::string>> merges_from_ranks(const std::vector<std::string>& token_bytes) {
  std::unordered_map<std::string, int64_t> ranks;
  for (size_t r = 0; r < token_bytes.size(); ++r) ranks.emplace(token_bytes[r], static_cast<int64_t>(r));
  std::vector<std::pair<std::string, std::string>> merges;
  for (size_t r = 0; r < token_bytes.size(); ++r) {
    if (token_bytes[r].size() < 2) continue;
    std::vector<std::string> parts = merge_below(token_bytes[r], static_cast<int64_t>(r), ranks);
    if (parts.size() != 2)
      throw Error("tiktoken ranks: the token of rank " + std::to_string(r) + " (" + std::to_string(token_bytes[r].size()) +
                  " bytes) merges from the lower ranks into " + std::to_string(parts.size()) +
                  " parts, not 2, so no merge list reproduces this rank table");
    merges.emplace_back(std::move(parts[0]), std::move(parts[1]));
  }
  return merges;
}

}  // namespace loom::interop::gguf
