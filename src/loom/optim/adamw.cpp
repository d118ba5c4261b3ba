#include "loom/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <utility>
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
  // As few calls as the pieces' distinct (learning-rate scale, weight decay) pairs allow: each
  // tensor names its step among the call's (a model's decayed weights and undecayed norms and
  // biases alternate; a call per run of one kind had made a launch each).
  std::vector<kernels::AdamWTensor> run;
  std::vector<std::pair<float, bool>> kinds;
  std::vector<kernels::AdamWStep> steps;
  auto flush = [&] {
    if (!run.empty()) kernels::adamw_update_many(device_, run, steps);
    run.clear();
    kinds.clear();
    steps.clear();
  };
  for (const ShardPiece& p : pieces) {
    const std::pair<float, bool> kind{p.lr_scale, p.weight_decay};
    auto it = std::find(kinds.begin(), kinds.end(), kind);
    if (it == kinds.end()) {
      if (static_cast<int>(kinds.size()) == kernels::kMaxAdamWSteps) flush();
      kinds.push_back(kind);
      steps.push_back(adamw_hyper(config_, step.lr * p.lr_scale, step.step, p.weight_decay, step.clip_factor));
      it = kinds.end() - 1;
    }
    run.push_back({p.param, p.grad, p.state[0], p.state[1], p.numel, p.param_bf16, p.fp8,
                   static_cast<int>(it - kinds.begin())});
  }
  flush();
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
