#include "loom/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace loom::optim {

namespace {

// The share of lr - min_lr left after a fraction `progress` in [0, 1] of the annealing.
double annealed(config::WsdDecay style, double progress) {
  switch (style) {
    case config::WsdDecay::Exponential: return 2.0 * std::pow(0.5, progress) - 1.0;
    case config::WsdDecay::Linear: return 1.0 - progress;
    case config::WsdDecay::Cosine: return 0.5 * (1.0 + std::cos(M_PI * progress));
    case config::WsdDecay::MinusSqrt: return 1.0 - std::sqrt(progress);
  }
  return 0.0;
}

}  // namespace

double learning_rate(const config::OptimConfig& config, int step, int total_steps) {
  using config::LrSchedule;
  if (config.warmup_steps > 0 && step <= config.warmup_steps) {
    return config.lr * static_cast<double>(step) / static_cast<double>(config.warmup_steps);
  }
  if (config.schedule == LrSchedule::Constant) return config.lr;
  const int decay_end = config.decay_steps > 0 ? config.decay_steps : total_steps;
  if (step > decay_end) return config.min_lr;
  if (config.schedule == LrSchedule::InverseSquareRoot) {
    const double warmup = std::max(config.warmup_steps, 1);
    return std::max(config.min_lr, config.lr * std::sqrt(warmup) / std::sqrt(static_cast<double>(std::max(step, 1))));
  }
  const int decay_steps = std::max(1, decay_end - config.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - config.warmup_steps) / decay_steps, 0.0, 1.0);
  switch (config.schedule) {
    case LrSchedule::Linear: return config.min_lr + (config.lr - config.min_lr) * (1.0 - progress);
    case LrSchedule::Wsd: {
      const int anneal_start = decay_end - config.wsd_decay_steps;
      if (step <= anneal_start) return config.lr;
      const double annealing = static_cast<double>(step - anneal_start) / std::max(1, config.wsd_decay_steps);
      return config.min_lr + (config.lr - config.min_lr) * annealed(config.wsd_decay_style, annealing);
    }
    default: return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
}

}  // namespace loom::optim
