#include "loom/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace loom::optim {

double learning_rate(const config::OptimConfig& config, int step, int total_steps) {
  if (config.warmup_steps > 0 && step <= config.warmup_steps) {
    return config.lr * static_cast<double>(step) / static_cast<double>(config.warmup_steps);
  }
  if (config.schedule == config::LrSchedule::Constant) return config.lr;
  const int decay_steps = std::max(1, total_steps - config.warmup_steps);
  const double progress = std::clamp(static_cast<double>(step - config.warmup_steps) / decay_steps, 0.0, 1.0);
  return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace loom::optim
