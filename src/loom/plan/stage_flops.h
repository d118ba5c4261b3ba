#pragma once
// The training FLOPs of a pipeline stage as the step-time model (time_plan.cpp) splits them by the
// rate each runs at: the blocks' (attention's score and value products apart), what every
// tensor-parallel rank computes whole, the head's, the FP8 linears', and the FP8 routed experts'
// padding rows.
#include <vector>

#include "loom/config/run_config.h"
#include "loom/model/layer_spec.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

// Training FLOPs per token of a stage's blocks, of which attention's score and value products,
// the Mamba-2 mixers' scans, and what every tensor-parallel rank computes whole over all the
// group's tokens (`replicated`: each MoE layer's router forward, which every rank runs over the
// whole group before dispatching its share of the tokens, and its shared expert's gate where no
// sequence parallelism gives each rank its own rows), and of its head (model/flops.h). On the
// rank holding the head, the multi-token prediction depths' blocks count as blocks (their linears
// are the stage's block linears, for_each_block_linear) and their eh_proj not at all
// (replicated_linear_flops_per_token); the head's FLOPs keep the head once per depth.
struct StageFlops {
  double block = 0.0, attention = 0.0, scan = 0.0, replicated = 0.0, head = 0.0;
};
StageFlops stage_flops(const config::RunConfig& config, const StageMemory& stage,
                       const std::vector<model::LayerSpec>& specs);

// Training FLOPs per token of this rank's linears whose products run in FP8 (per-tensor or
// blockwise scaled: fp8_delayed, fp8_current, fp8_blockwise; not MXFP8, which Hopper multiplies
// in bf16, nor the layers the recipe keeps in bf16, nor the head): 6 x their weights, those
// split over the tensor-parallel group apart from the routed experts', which every rank
// computes whole over all the group's tokens.
struct Fp8Flops {
  double split = 0.0, experts = 0.0;
};
Fp8Flops fp8_linear_flops_per_token(const config::RunConfig& config, const StageMemory& stage);

// Training FLOPs per micro-batch of the zero rows padding each routed expert's rows to the 16 (128)
// rows an FP8 product takes (ExpertMlp::padded_rows), at their bound, as the memory plan counts
// their activations (LayerWidths::padded_expert_rows): multiple - 1 rows per local expert through
// both projections' three GEMMs, in the FP8 blocks (the layers' and, on the rank holding the head,
// the multi-token prediction depths' blocks, as for_each_block_linear visits them).
double expert_padding_flops(const config::RunConfig& config, const StageMemory& stage);

// Training FLOPs per token of this rank's linears every tensor-parallel rank computes whole over
// all rows (multi-token prediction's eh_proj): not shared out over the group.
double replicated_linear_flops_per_token(const config::RunConfig& config, const StageMemory& stage);

}  // namespace loom::plan
