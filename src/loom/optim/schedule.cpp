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

double learning_rate(const config::OptimConfig& config, int64_t position, int64_t total, ScheduleUnit unit) {
  using config::LrSchedule;
  const bool samples = unit == ScheduleUnit::Samples;
  const int64_t warmup = samples ? config.warmup_samples : config.warmup_steps;
  const int64_t decay = samples ? config.decay_samples : config.decay_steps;
  const int64_t wsd_decay = samples ? config.wsd_decay_samples : config.wsd_decay_steps;
  const auto ratio = [](int64_t a, int64_t b) { return static_cast<double>(a) / static_cast<double>(b); };
  if (warmup > 0 && position <= warmup) return config.lr * ratio(position, warmup);
  if (config.schedule == LrSchedule::Constant) return config.lr;
  const int64_t decay_end = decay > 0 ? decay : total;
  if (position > decay_end) return config.min_lr;
  if (config.schedule == LrSchedule::InverseSquareRoot) {
    const double w = static_cast<double>(std::max<int64_t>(warmup, 1));
    const double p = static_cast<double>(std::max<int64_t>(position, 1));
    return std::max(config.min_lr, config.lr * std::sqrt(w) / std::sqrt(p));
  }
  const double progress = std::clamp(ratio(position - warmup, std::max<int64_t>(1, decay_end - warmup)), 0.0, 1.0);
  switch (config.schedule) {
    case LrSchedule::Linear: return config.min_lr + (config.lr - config.min_lr) * (1.0 - progress);
    case LrSchedule::Wsd: {
      const int64_t anneal_start = decay_end - wsd_decay;
      if (position <= anneal_start) return config.lr;
      const double annealing = ratio(position - anneal_start, std::max<int64_t>(1, wsd_decay));
      return config.min_lr + (config.lr - config.min_lr) * annealed(config.wsd_decay_style, annealing);
    }
    default: return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1.0 + std::cos(M_PI * progress));
  }
}

}  // namespace loom::optim
