#include "loom/data/dataset_split.h"

#include <charconv>
#include <cmath>

#include "loom/core/error.h"

namespace loom::data {

const char* split_part_name(SplitPart part) {
  switch (part) {
    case SplitPart::Train: return "train";
    case SplitPart::Validation: return "validation";
    case SplitPart::Test: return "test";
  }
  return "?";
}

std::array<double, 3> normalized_split(const std::vector<double>& shares) {
  LOOM_CHECK(!shares.empty() && shares.size() <= 3,
             "a split has 1 to 3 shares (train, validation, test), not " + std::to_string(shares.size()));
  double sum = 0.0;  // summed left to right, as Python's sum()
  for (const double share : shares) {
    LOOM_CHECK(share >= 0.0 && std::isfinite(share), "a split's shares are finite and at least 0, not " +
                                                          split_text(shares));
    sum += share;
  }
  LOOM_CHECK(sum > 0.0, "a split's shares sum to more than 0, not " + split_text(shares));
  std::array<double, 3> normalized{0.0, 0.0, 0.0};
  for (size_t i = 0; i < shares.size(); ++i) normalized[i] = shares[i] / sum;
  return normalized;
}

std::array<int64_t, 4> split_bounds(const std::vector<double>& shares, int64_t count) {
  const std::array<double, 3> normalized = normalized_split(shares);
  std::array<int64_t, 4> bounds{0, 0, 0, 0};
  for (size_t i = 0; i < 3; ++i) {
    // std::nearbyint rounds halves to even under the default rounding mode, as Python's round().
    bounds[i + 1] = bounds[i] + static_cast<int64_t>(std::nearbyint(normalized[i] * static_cast<double>(count)));
  }
  const int64_t surplus = bounds[3] - count;  // what the rounding added (or took), taken off every boundary
  for (size_t i = 1; i < 4; ++i) bounds[i] -= surplus;
  return bounds;
}

SequenceRange split_range(const std::vector<double>& shares, SplitPart part, int64_t count) {
  const std::array<int64_t, 4> bounds = split_bounds(shares, count);
  const auto i = static_cast<size_t>(part);
  return {bounds[i], bounds[i + 1]};
}

std::string split_text(const std::vector<double>& shares) {
  std::string text;
  for (size_t i = 0; i < shares.size(); ++i) {
    char number[32];
    const auto written = std::to_chars(number, number + sizeof number, shares[i]);
    text.append(i == 0 ? "" : ",").append(number, written.ptr);
  }
  return text;
}

}  // namespace loom::data
