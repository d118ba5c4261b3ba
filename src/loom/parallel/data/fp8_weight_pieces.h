#pragma once
// The per-tensor FP8 weights' amaxes and codes written by the optimizer's pass at ZeRO 0
// (model/optimizer_weight_casts.h): which runs keep them, and which of a step's optimizer pieces
// write them.
#include <vector>

#include "loom/config/run_config.h"
#include "loom/model/optimizer_weight_casts.h"
#include "loom/optim/optimizer.h"

namespace loom::parallel {

// ZeRO 0 (every rank updates every value of its weights), fp32 parameters (the GEMMs read the
// values the update writes), on a device, under fp8_delayed or fp8_current, by an optimizer that
// writes them (AdamW), unless precision.fp8_weights_from_optimizer is false.
bool keeps_fp8_weight_casts(const config::RunConfig& config);

// Each of `targets`' weights that is one piece, or a run of pieces laid out one after the other
// in every array with the same hyper-parameters (a fused GEMM's parameters: q, k and v; gate and
// up), which become one piece, gets its amax and (fp8_delayed) codes to write; returns the targets
// that got one. Any other weight gets none: its layer takes its amax and casts it as before.
std::vector<model::OptimizerWeightCasts::Entry*> give_fp8_weights(
    std::vector<optim::ShardPiece>& pieces, const std::vector<model::OptimizerWeightCasts::Entry*>& targets);

}  // namespace loom::parallel
