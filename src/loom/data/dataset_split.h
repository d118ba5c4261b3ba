#pragma once
// Megatron's --split (data.split, e.g. "969,30,1"): a dataset's sequences cut into train,
// validation and test parts, in order, in proportion to three shares. The part boundaries are
// Megatron-Core's (_get_split_indices over the normalised shares, Python's round-half-to-even),
// so a dataset splits where Megatron splits it.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

enum class SplitPart { Train = 0, Validation = 1, Test = 2 };
const char* split_part_name(SplitPart part);  // "train", "validation", "test"

// The shares padded with zeros to three and divided by their sum (Megatron's
// parse_and_normalize_split). Throws loom::Error on more than three shares, a negative one, or
// a zero sum.
std::array<double, 3> normalized_split(const std::vector<double>& shares);

// The boundaries of the three parts of `count` sequences: part i is [bounds[i], bounds[i + 1]),
// bounds[0] = 0 and bounds[3] = count.
std::array<int64_t, 4> split_bounds(const std::vector<double>& shares, int64_t count);

// Sequences [begin, end) of a dataset.
struct SequenceRange {
  int64_t begin = 0, end = 0;
};

// The sequences of `part` among `count`.
SequenceRange split_range(const std::vector<double>& shares, SplitPart part, int64_t count);

// "969,30,1" (as Megatron writes its --split; each share the shortest text that reads back as it).
std::string split_text(const std::vector<double>& shares);

}  // namespace loom::data
