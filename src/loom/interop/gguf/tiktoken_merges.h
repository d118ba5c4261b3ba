#pragma once
// A tiktoken rank table as the ranked merge list of a GGUF `gpt2` vocabulary: byte-pair merging
// by rank (tiktoken) and by merge order (llama.cpp) agree when merge i builds the token of the
// i-th multi-byte rank from the two parts that merging its bytes with only the lower ranks leaves.
#include <string>
#include <utility>
#include <vector>

namespace loom::interop::gguf {

// token_bytes[rank]: the bytes of the token of that rank. Returns, in rank order, one
// (left bytes, right bytes) merge per multi-byte token. Throws loom::Error naming the rank when
// merging a token's bytes with the lower ranks does not end in exactly two parts (no merge list
// can reproduce such a table).
std::vector<std::pair<std::string, std::string>> merges_from_ranks(const std::vector<std::string>& token_bytes);

}  // namespace loom::interop::gguf
