#include "loom/infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::model {

double TokenDistribution::probability(int32_t id) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] == id) return weights[i] / sum;
  }
  return 0.0;
}

TokenDistribution token_distribution(const float* logits, int64_t vocab, const SamplingParams& params) {
  LOOM_CHECK(std::isfinite(params.temperature) && params.temperature >= 0.0,
             "sampling: temperature is " + std::to_string(params.temperature) + "; expected a finite number >= 0");
  LOOM_CHECK(std::isfinite(params.top_p) && params.top_p >= 0.0 && params.top_p <= 1.0,
             "sampling: top_p is " + std::to_string(params.top_p) + "; expected a number in [0, 1]");
  LOOM_CHECK(std::isfinite(params.min_p) && params.min_p >= 0.0 && params.min_p <= 1.0,
             "sampling: min_p is " + std::to_string(params.min_p) + "; expected a number in [0, 1]");
  TokenDistribution out;
  if (params.temperature <= 0.0) {
    out.ids = {static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits)};
    out.weights = {1.0};
    out.sum = 1.0;
    return out;
  }
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = vocab;
  if (params.top_k > 0 && params.top_k < vocab) {
    keep = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  } else {
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  std::vector<double> probs(keep);
  const double max_logit = logits[order[0]];
  double sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / params.temperature);
    sum += probs[i];
  }
  // min-p: probs[0] is the most likely token's (sorted); keep those at least min_p of it.
  if (params.min_p > 0.0) {
    int64_t kept = 1;
    while (kept < keep && probs[kept] >= params.min_p * probs[0]) ++kept;
    keep = kept;
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  // Nucleus: the smallest prefix of the sorted distribution whose mass reaches top_p.
  if (params.top_p < 1.0) {
    double mass = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
      mass += probs[i] / sum;
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  order.resize(static_cast<size_t>(keep));
  probs.resize(static_cast<size_t>(keep));
  out.ids = std::move(order);
  out.weights = std::move(probs);
  out.sum = sum;
  return out;
}

int32_t draw_token(const TokenDistribution& distribution, double u) {
  const double target = u * distribution.sum;
  double cumulative = 0.0;
  for (size_t i = 0; i < distribution.ids.size(); ++i) {
    cumulative += distribution.weights[i];
    if (target < cumulative) return distribution.ids[i];
  }
  return distribution.ids.back();
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t key, uint64_t index) {
  const TokenDistribution distribution = token_distribution(logits, vocab, params);
  if (params.temperature <= 0.0) return distribution.ids.front();
  return draw_token(distribution, static_cast<double>(philox_uniform(key, index)));
}

}  // namespace loom::model
