#include "loom/config/suggestion.h"

#include <algorithm>

namespace loom::config {

namespace {

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, so a swapped
// pair of letters ("stpes") counts as one typo.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  if (word.size() >= 3) {
    int matches = 0;
    for (const auto& candidate : candidates) {
      if (std::string_view(candidate).starts_with(word)) {
        best = candidate;
        ++matches;
      }
    }
    if (matches == 1) return best;
    best.reset();  // ambiguous ("eval"): fall back to edit distance
  }
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& candidate : candidates) {
    size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  return best;
}

std::string suggestion(std::string_view word, const std::vector<std::string>& candidates) {
  auto best = closest(word, candidates);
  if (!best) return "";
  std::string out = "; did you mean '";
  return out.append(*best).append("'?");
}

}  // namespace loom::config
