#include "loom/kernels/cpu/vocab_parallel_cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/fast_math.h"
#include "loom/kernels/cpu/parallel.h"

namespace loom::kernels::cpu {

void vocab_shard_row_max(const float* logits, int64_t rows, int64_t vocab_shard, float* row_max) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * vocab_shard))
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * vocab_shard;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < vocab_shard; ++i) m = std::max(m, z[i]);
    row_max[r] = m;
  }
}

void vocab_shard_exp_sums(const float* logits, const float* row_max, const int32_t* targets, int64_t rows,
                          int64_t vocab_shard, int64_t first_id, float* stats) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * vocab_shard))
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * vocab_shard;
    const float m = row_max[r];
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < vocab_shard; ++i) sum += fast_exp(z[i] - m);
    const int64_t local = static_cast<int64_t>(targets[r]) - first_id;
    const bool mine = targets[r] != kIgnoreIndex && local >= 0 && local < vocab_shard;
    stats[2 * r] = sum;
    stats[2 * r + 1] = mine ? z[local] : 0.0f;
  }
}

double vocab_shard_finish(float* logits, float* losses, const float* row_max, const float* stats,
                          const int32_t* targets, int64_t rows, int64_t vocab_shard, int64_t first_id,
                          float grad_scale) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * vocab_shard))
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * vocab_shard;
    if (targets[r] == kIgnoreIndex) {
      losses[r] = 0.0f;
      if (grad_scale != 0.0f) std::fill(z, z + vocab_shard, 0.0f);
      continue;
    }
    const float m = row_max[r], sum = stats[2 * r];
    losses[r] = static_cast<float>(std::log(static_cast<double>(sum)) + m - stats[2 * r + 1]);
    if (grad_scale != 0.0f) {
      const float factor = grad_scale / sum;
#pragma omp simd
      for (int64_t i = 0; i < vocab_shard; ++i) z[i] = factor * fast_exp(z[i] - m);
      const int64_t local = static_cast<int64_t>(targets[r]) - first_id;
      if (local >= 0 && local < vocab_shard) z[local] -= grad_scale;
    }
  }
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += losses[r];
  return total;
}

void vocab_shard_gradient(float* logits, const float* row_max, const float* stats, const int32_t* targets,
                          int64_t rows, int64_t vocab_shard, int64_t first_id, const float* row_scale) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * vocab_shard))
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * vocab_shard;
    const float scale = targets[r] == kIgnoreIndex ? 0.0f : row_scale[r];
    if (scale == 0.0f) {
      std::fill(z, z + vocab_shard, 0.0f);
      continue;
    }
    const float m = row_max[r], factor = scale / stats[2 * r];
#pragma omp simd
    for (int64_t i = 0; i < vocab_shard; ++i) z[i] = factor * fast_exp(z[i] - m);
    const int64_t local = static_cast<int64_t>(targets[r]) - first_id;
    if (local >= 0 && local < vocab_shard) z[local] -= scale;
  }
}

}  // namespace loom::kernels::cpu
