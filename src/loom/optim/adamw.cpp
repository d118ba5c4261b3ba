#include "loom/optim/adamw.h"

#include <cmath>

#include "loom/kernels/cpu/adamw.h"

namespace loom::optim {

namespace k = loom::kernels::cpu;

AdamW::AdamW(const runtime::OptimConfig& config, int64_t total, std::vector<Segment> segments)
    : config_(config),
      total_(total),
      segments_(std::move(segments)),
      exp_avg_({total}, DType::F32),
      exp_avg_sq_({total}, DType::F32) {}

k::AdamWStep adamw_hyper(const runtime::OptimConfig& config, double lr, int64_t step, bool weight_decay,
                         float clip_factor) {
  return {static_cast<float>(lr),
          static_cast<float>(config.beta1),
          static_cast<float>(config.beta2),
          static_cast<float>(config.eps),
          weight_decay ? static_cast<float>(config.weight_decay) : 0.0f,
          step,
          clip_factor};
}

double global_norm(const float* grads, int64_t n) { return std::sqrt(k::sum_of_squares(grads, n)); }

double AdamW::step(float* params, const float* grads, double lr, int64_t step) {
  const double norm = global_norm(grads, total_);
  // Clipping is fused into the update (one pass over the gradients fewer).
  float clip_factor = 1.0f;
  if (config_.clip_grad > 0.0 && norm > config_.clip_grad) {
    clip_factor = static_cast<float>(config_.clip_grad / (norm + 1e-6));
  }
  for (const Segment& s : segments_) {
    k::adamw_update(params + s.offset, grads + s.offset, exp_avg() + s.offset, exp_avg_sq() + s.offset, s.numel,
                    adamw_hyper(config_, lr, step, s.weight_decay, clip_factor));
  }
  return norm;
}

}  // namespace loom::optim
