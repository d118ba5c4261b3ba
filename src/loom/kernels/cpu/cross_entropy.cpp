#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/cpu/parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/core/error.h"

namespace loom::kernels::cpu {

double softmax_cross_entropy(float* logits, float* losses, const int32_t* targets, int64_t rows,
                             int64_t vocab, float grad_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    int32_t t = targets[r];
    LOOM_CHECK(t == kIgnoreIndex || (t >= 0 && t < vocab),
          "cross-entropy: target id " + std::to_string(t) + " is outside the vocabulary [0, " +
              std::to_string(vocab) + ")");
  }
#pragma omp parallel for schedule(static) if(worth_parallel(rows * vocab))
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * vocab;
    const int32_t target = targets[r];
    if (target == kIgnoreIndex) {
      losses[r] = 0.0f;
      if (grad_scale != 0.0f) std::fill(z, z + vocab, 0.0f);
      continue;
    }
    float max_logit = -INFINITY;
#pragma omp simd reduction(max : max_logit)
    for (int64_t i = 0; i < vocab; ++i) max_logit = std::max(max_logit, z[i]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < vocab; ++i) sum += fast_exp(z[i] - max_logit);
    losses[r] = static_cast<float>(std::log(static_cast<double>(sum)) + max_logit - z[target]);
    if (grad_scale != 0.0f) {
      const float factor = grad_scale / sum;
#pragma omp simd
      for (int64_t i = 0; i < vocab; ++i) z[i] = factor * fast_exp(z[i] - max_logit);
      z[target] -= grad_scale;
    }
  }
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += losses[r];
  return total;
}

double softmax_cross_entropy_bf16(void* logits, float* losses, const int32_t* targets, int64_t rows, int64_t vocab,
                                  float grad_scale) {
  std::vector<float> wide = widened_bf16(logits, rows * vocab);
  const double total = softmax_cross_entropy(wide.data(), losses, targets, rows, vocab, grad_scale);
  if (grad_scale != 0.0f) narrow_floats(logits, wide.data(), rows * vocab, DType::BF16);
  return total;
}

}  // namespace loom::kernels::cpu
