#include "loom/optim/adamw.h"

#include <cmath>

#include "loom/kernels/cpu/adamw.h"

namespace loom::optim {

namespace k = loom::kernels::cpu;

AdamW::AdamW(const config::OptimConfig& config) : config_(config) {}

AdamW::AdamW(const config::OptimConfig& config, int64_t total, std::vector<Segment> segments)
    : config_(config),
      total_(total),
      segments_(std::move(segments)),
      exp_avg_({total}, DType::F32),
      exp_avg_sq_({total}, DType::F32) {}

k::AdamWStep adamw_hyper(const config::OptimConfig& config, double lr, int64_t step, bool weight_decay,
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

void AdamW::update(const ShardPiece& piece, const StepParams& step) const {
  k::adamw_update(piece.param, piece.grad, piece.state[0], piece.state[1], piece.numel,
                  adamw_hyper(config_, step.lr, step.step, piece.weight_decay, step.clip_factor));
}

double AdamW::step(float* params, const float* grads, double lr, int64_t step) {
  const double norm = global_norm(grads, total_);
  step_with_norm(params, grads, lr, step, norm);
  return norm;
}

void AdamW::step_with_norm(float* params, const float* grads, double lr, int64_t step, double global_norm) {
  // Clipping is fused into the update (one pass over the gradients fewer).
  const StepParams at{lr, step, clip_factor(config_, global_norm)};
  for (const Segment& s : segments_) {
    update({params + s.offset, grads + s.offset, {exp_avg() + s.offset, exp_avg_sq() + s.offset}, s.numel,
            s.weight_decay},
           at);
  }
}

}  // namespace loom::optim
