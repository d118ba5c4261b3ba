#pragma once
// The dtype a run's model parameters are held in between uses, and gathered in by ZeRO 1-3:
// precision.param_dtype=compute holds them in the recipe's compute dtype (bf16; fp16 under the
// fp16 recipe), the fp32 master weights living in the optimizer (Megatron's bf16 models); fp32
// otherwise, and always under the fp32 recipe, whose compute dtype is fp32. The training code
// (gradient_sync.cpp) and the planner (plan/) both take it from here.
#include "loom/config/run_config.h"
#include "loom/core/dtype.h"

namespace loom::parallel {

DType parameter_dtype(const config::RunConfig& config);

}  // namespace loom::parallel
