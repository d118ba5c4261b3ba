#include "loom/kernels/router_scores.h"

#include <algorithm>
#include <cmath>

namespace loom::kernels {

void softmax_row(const float* logits, float* out, int n) {
  const float max = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int e = 0; e < n; ++e) sum += out[e] = std::exp(logits[e] - max);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = 0; e < n; ++e) out[e] *= inv;
}

void router_scores(RouterKind kind, const float* logits, float* out, int n) {
  if (kind == RouterKind::Sigmoid) {
    for (int e = 0; e < n; ++e) out[e] = 1.0f / (1.0f + std::exp(-logits[e]));
  } else {
    softmax_row(logits, out, n);
  }
}

double log_sum_exp(const float* logits, int n) {
  const float max = *std::max_element(logits, logits + n);
  double sum = 0.0;
  for (int e = 0; e < n; ++e) sum += std::exp(static_cast<double>(logits[e] - max));
  return max + std::log(sum);
}

}  // namespace loom::kernels
