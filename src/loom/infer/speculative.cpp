#include "loom/infer/speculative.h"

#include <algorithm>
#include <unordered_map>

namespace loom::infer {

bool accept_draft(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                  int32_t draft, double u) {
  const double q = draft_distribution.probability(draft);
  if (q <= 0.0) return false;  // never drawn from it; refused rather than divided by zero
  return u * q < target.probability(draft);
}

int32_t residual_token(const model::TokenDistribution& target, const model::TokenDistribution& draft_distribution,
                       double u) {
  std::unordered_map<int32_t, double> draft_probability;
  draft_probability.reserve(draft_distribution.ids.size());
  for (size_t i = 0; i < draft_distribution.ids.size(); ++i) {
    draft_probability[draft_distribution.ids[i]] = draft_distribution.weights[i] / draft_distribution.sum;
  }
  model::TokenDistribution residual;
  for (size_t i = 0; i < target.ids.size(); ++i) {
    const auto found = draft_probability.find(target.ids[i]);
    const double q = found == draft_probability.end() ? 0.0 : found->second;
    const double left = target.weights[i] / target.sum - q;
    if (left <= 0.0) continue;
    residual.ids.push_back(target.ids[i]);
    residual.weights.push_back(left);
    residual.sum += left;
  }
  if (residual.ids.empty()) return model::draw_token(target, u);
  return model::draw_token(residual, u);
}

}  // namespace loom::infer
