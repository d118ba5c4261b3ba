#pragma once
// Learning-rate schedule: linear warmup from 0, then cosine decay to min_lr at the last step
// (or constant), as Megatron-Core's OptimizerParamScheduler does.
#include "loom/config/run_config.h"

namespace loom::optim {

// lr for optimizer step `step` (1-based) of `total_steps`.
double learning_rate(const config::OptimConfig& config, int step, int total_steps);

}  // namespace loom::optim
