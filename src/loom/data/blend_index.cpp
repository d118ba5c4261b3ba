#include "loom/data/blend_index.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "loom/core/error.h"

namespace loom::data {

namespace {

using u128 = unsigned __int128;

constexpr double kLargestWeight = 1099511627776.0;  // 2^40
constexpr double kLargestDecimal = 1125899906842624.0;  // 2^50

// The weights as integers in the same ratios. Weights written with up to 12 decimals (0.7 and
// 0.3, 33 and 11) become exact integers (7 and 3), so ratios that are exact in decimal stay
// exact, ties included; any others are scaled to the largest being 2^40.
std::vector<uint64_t> integer_weights(const std::vector<double>& weights) {
  double scale = 1;
  for (int decimals = 0; decimals <= 12; ++decimals, scale *= 10) {
    bool exact = true;
    for (const double w : weights) {
      const double scaled = w * scale;
      exact = exact && scaled <= kLargestDecimal && std::abs(scaled - std::round(scaled)) <= 1e-14 * scaled &&
              std::round(scaled) >= 1;
    }
    if (!exact) continue;
    std::vector<uint64_t> out;
    for (const double w : weights) out.push_back(static_cast<uint64_t>(std::llround(w * scale)));
    return out;
  }
  const double largest = *std::max_element(weights.begin(), weights.end());
  std::vector<uint64_t> out;
  for (const double w : weights) {
    out.push_back(std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(w / largest * kLargestWeight))));
  }
  return out;
}

}  // namespace

BlendIndex::BlendIndex(const std::vector<double>& weights) {
  LOOM_CHECK(!weights.empty(), "a blend needs at least one dataset");
  for (size_t i = 0; i < weights.size(); ++i) {
    LOOM_CHECK(std::isfinite(weights[i]) && weights[i] > 0,
               "blend weight " + std::to_string(i) + " is " + std::to_string(weights[i]) + ": must be finite and > 0");
  }
  weights_ = integer_weights(weights);
}

// Pair (j, m) comes before (i, k) when W_j / (2m + 1) > W_i / (2k + 1), or on equal quotients
// when j < i: for dataset j, the m >= 0 with (2m + 1) W_i < W_j (2k + 1) (<= for j < i), that is
// the odd numbers up to floor((W_j (2k + 1) - 1) / W_i) (floor(W_j (2k + 1) / W_i) for j < i).
// Dataset i itself contributes its k earlier samples.
unsigned __int128 BlendIndex::position(int dataset, int64_t k) const {
  const u128 wi = weights_[static_cast<size_t>(dataset)];
  const u128 odd = 2 * static_cast<u128>(k) + 1;
  u128 before = 0;
  for (int j = 0; j < datasets(); ++j) {
    const u128 product = static_cast<u128>(weights_[static_cast<size_t>(j)]) * odd;
    const u128 largest_odd = j < dataset ? product / wi : (product - 1) / wi;
    before += (largest_odd + 1) / 2;
  }
  return before;
}

std::vector<int64_t> BlendIndex::counts_before(int64_t g) const {
  LOOM_CHECK(g >= 0, "sample index " + std::to_string(g) + " is negative");
  std::vector<int64_t> counts(weights_.size());
  for (int i = 0; i < datasets(); ++i) {
    // The first k whose position is at or past g: position(i, k) rises with k, and
    // position(i, g) >= g.
    int64_t low = 0, high = g;
    while (low < high) {
      const int64_t mid = low + (high - low) / 2;
      if (position(i, mid) >= static_cast<u128>(g)) high = mid;
      else low = mid + 1;
    }
    counts[static_cast<size_t>(i)] = low;
  }
  return counts;
}

int BlendIndex::next(const std::vector<int64_t>& counts) const {
  int best = 0;
  for (int i = 1; i < datasets(); ++i) {
    // W_i / (2 c_i + 1) > W_best / (2 c_best + 1), cross-multiplied; a tie keeps the lower index.
    const u128 mine = static_cast<u128>(weights_[static_cast<size_t>(i)]) *
                      (2 * static_cast<u128>(counts[static_cast<size_t>(best)]) + 1);
    const u128 theirs = static_cast<u128>(weights_[static_cast<size_t>(best)]) *
                        (2 * static_cast<u128>(counts[static_cast<size_t>(i)]) + 1);
    if (mine > theirs) best = i;
  }
  return best;
}

std::vector<BlendIndex::Pick> BlendIndex::picks(int64_t first, int64_t n) const {
  std::vector<int64_t> counts = counts_before(first);
  std::vector<Pick> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t g = 0; g < n; ++g) {
    const int dataset = next(counts);
    out.push_back({dataset, counts[static_cast<size_t>(dataset)]++});
  }
  return out;
}

}  // namespace loom::data
