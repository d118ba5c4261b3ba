#pragma once
// Learning-rate schedule, as Megatron-Core's OptimizerParamScheduler computes it: linear warm-up
// from 0 over optim.warmup_steps, then a decay from optim.lr to optim.min_lr that ends at
// optim.decay_steps (train.steps when 0) and stays at min_lr after it (a run measured in samples:
// the same in samples, optim.warmup_samples, decay_samples, wsd_decay_samples and train.samples):
//   cosine               min_lr + (lr - min_lr) (1 + cos(pi r)) / 2, r the decay's progress in [0, 1]
//   linear               min_lr + (lr - min_lr) (1 - r)
//   wsd                  warmup-stable-decay: lr until the last optim.wsd_decay_steps of the decay,
//                        then an annealing to min_lr shaped by optim.wsd_decay_style (exponential:
//                        2 * 0.5^a - 1, linear: 1 - a, cosine: (1 + cos(pi a)) / 2, minus_sqrt:
//                        1 - sqrt(a), a the annealing's progress)
//   inverse_square_root  lr * sqrt(max(warmup_steps, 1) / step), never below min_lr
//   constant             lr
#include "loom/config/run_config.h"

namespace loom::optim {

// What a schedule counts: optimizer steps (optim.warmup_steps, decay_steps, wsd_decay_steps), or
// for a run measured in samples (train.samples) the samples consumed (optim.*_samples).
enum class ScheduleUnit { Steps, Samples };

// lr for the optimizer step at `position` of `total`: its 1-based step of train.steps, or the
// samples consumed with it of train.samples.
double learning_rate(const config::OptimConfig& config, int64_t position, int64_t total,
                     ScheduleUnit unit = ScheduleUnit::Steps);

}  // namespace loom::optim
