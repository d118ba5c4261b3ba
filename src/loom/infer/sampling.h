#pragma once
// Next-token sampling from logits: temperature, top-k, top-p (nucleus), min-p. Temperature 0 = greedy.
#include <cstdint>
#include <vector>

namespace loom::model {

struct SamplingParams {
  double temperature = 1.0;
  int top_k = 0;       // 0 = no limit
  double top_p = 1.0;  // 1 = no limit
  double min_p = 0.0;  // drop tokens less likely than min_p times the most likely (0 = none)
};

// The distribution a row of logits is sampled from under `params`: the ids kept, most likely
// first, with unnormalised weights summing to `sum` (greedy: the most likely id alone, weight 1).
struct TokenDistribution {
  std::vector<int32_t> ids;
  std::vector<double> weights;
  double sum = 0.0;
  // The probability of `id` (0 when it is not kept).
  double probability(int32_t id) const;
};
TokenDistribution token_distribution(const float* logits, int64_t vocab, const SamplingParams& params);
// The id whose cumulative weight first exceeds u x sum, for u in [0, 1).
int32_t draw_token(const TokenDistribution& distribution, double u);

// Draws with a counter-based Philox value keyed by (key, index): reproducible for a seed.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t key, uint64_t index);

}  // namespace loom::model
