#include "loom/optim/adamw.h"

#include <cmath>
#include <vector>

#include "loom/kernels/ops.h"

namespace loom::optim {

AdamW::AdamW(const config::OptimConfig& config, Device device) : config_(config), device_(device) {}

AdamW::AdamW(const config::OptimConfig& config, int64_t total, std::vector<Segment> segments, Device device)
    : config_(config),
      total_(total),
      segments_(std::move(segments)),
      device_(device),
      exp_avg_({total}, DType::F32, device),
      exp_avg_sq_({total}, DType::F32, device) {}

kernels::AdamWStep adamw_hyper(const config::OptimConfig& config, double lr, int64_t step, bool weight_decay,
                               float clip_factor) {
  return {static_cast<float>(lr),
          static_cast<float>(config.beta1),
          static_cast<float>(config.beta2),
          static_cast<float>(config.eps),
          weight_decay ? static_cast<float>(config.weight_decay) : 0.0f,
          step,
          clip_factor};
}

double global_norm(const float* grads, int64_t n, Device device) {
  return std::sqrt(kernels::sum_of_squares(device, grads, n));
}

void AdamW::update(const ShardPiece& piece, const StepParams& step) const {
  // The pass that writes the bf16 copy or an FP8 weight's amax and codes too.
  if (piece.param_bf16 != nullptr || piece.fp8.amax != nullptr) return update_many({&piece, 1}, step);
  kernels::adamw_update(device_, piece.param, piece.grad, piece.state[0], piece.state[1], piece.numel,
                        adamw_hyper(config_, step.lr * piece.lr_scale, step.step, piece.weight_decay, step.clip_factor));
}

void AdamW::update_many(std::span<const ShardPiece> pieces, const StepParams& step) const {
  std::vector<kernels::AdamWTensor> run;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ShardPiece& p = pieces[i];
    run.push_back({p.param, p.grad, p.state[0], p.state[1], p.numel, p.param_bf16, p.fp8});
    const bool last = i + 1 == pieces.size() || pieces[i + 1].weight_decay != p.weight_decay ||
                      pieces[i + 1].lr_scale != p.lr_scale;
    if (!last) continue;
    kernels::adamw_update_many(device_, run,
                               adamw_hyper(config_, step.lr * p.lr_scale, step.step, p.weight_decay, step.clip_factor));
    run.clear();
  }
}

double AdamW::step(float* params, const float* grads, double lr, int64_t step) {
  const double norm = global_norm(grads, total_, device_);
  step_with_norm(params, grads, lr, step, norm);
  return norm;
}

void AdamW::step_with_norm(float* params, const float* grads, double lr, int64_t step, double global_norm) {
  // Clipping is fused into the update (one pass over the gradients fewer).
  const StepParams at{lr, step, clip_factor(config_, global_norm)};
  for (const Segment& s : segments_) {
    update({params + s.offset, grads + s.offset, {exp_avg() + s.offset, exp_avg_sq() + s.offset}, s.numel,
            s.weight_decay, s.lr_scale},
           at);
  }
}

}  // namespace loom::optim
