#pragma once
// Whether a layout's GEMMs can run in its precision recipe on a GPU: cuBLASLt's FP8 products take
// only dimensions that are multiples of 16 (128 for fp8_blockwise), which a layer's widths on a
// tensor-parallel rank and a micro-batch's tokens may not be. The model stops with that error at
// its first such GEMM (model::check_device_shape); the planner refuses the layout up front, so
// `loom plan` says so and `loom plan search` never ranks it.
#include <cstdint>

#include "loom/config/run_config.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

// Throws loom::Error naming the layer, its linear, its widths on this rank and the rule where a
// block linear of `stage` under runtime.device=cuda cannot run its FP8 recipe over `tokens` rows
// per micro-batch (the routed experts' rows are padded to the multiple: only their widths count).
void check_device_gemm_shapes(const config::RunConfig& config, const StageMemory& stage, int64_t tokens);

}  // namespace loom::plan
