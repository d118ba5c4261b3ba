#pragma once
// The step-time model's (time_plan.h) tensor- and expert-parallel communication of one pipeline
// stage's rank per micro-batch, collective by collective as the model runs it.
#include "loom/config/run_config.h"
#include "loom/model/linear_precision.h"
#include "loom/plan/hardware.h"
#include "loom/plan/memory_plan.h"

namespace loom::plan {

// One micro-batch's tensor-parallel collectives on this rank (model/tensor_parallel.h's f and g,
// collective by collective): forward and backward seconds, and of the backward's the seconds that
// run beside the column-parallel layers' GEMMs (parallel.overlap_tp_comm: each layer's input
// gathered again beside its dgrad, its input gradient's sum beside its wgrad, hidden as far as
// the GEMM lasts).
struct TpSeconds {
  double forward = 0.0, backward = 0.0;
  double hidden_backward = 0.0;
};

// A rank's GEMM rates (FLOP/s) by the linear's recipe: per-tensor and blockwise FP8 at `fp8`, the
// rest at `plain` (stage_flops.h's split).
struct GemmRates {
  double plain = 1.0, fp8 = 1.0;
  double of(model::Recipe r) const { return model::is_fp8(r) && r != model::Recipe::Mxfp8 ? fp8 : plain; }
};

// Bytes per element of the activations and gradients the model's collectives move: fp32 whatever
// the activations' storage (Hardware::activation_bytes): TensorParallel's reductions and gathers
// (DType::F32, model/tensor_parallel.cpp) but for the bf16 rows of kBf16GatherBytes, context
// parallelism's hops and all-to-alls (parallel/context/communication.cpp), expert parallelism's
// token exchanges (parallel/expert/communication.cpp) and the pipeline's sends
// (parallel/pipeline/communication.cpp).
constexpr double kCommBytes = 4.0;
// A sequence-parallel region's input rows gathered in bf16 (TensorParallel::enter_forward_bf16, in
// ColumnParallelLinear's forward and its wgrad's gather): the rows a norm writes bf16 for
// attention and a dense MLP under the bf16 recipe on a GPU (LinearPrecision::takes_bf16_tensors).
constexpr double kBf16GatherBytes = 2.0;

// Over a group of `tp` ranks joined by `link`, for `tokens` rows of the micro-batch (before
// sequence parallelism splits them): every block's regions, the embedding's and the head's, the
// multi-token prediction depths' and the gradient sums (parallel_comm.cpp says which collective
// each makes).
TpSeconds tensor_parallel_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, int tp,
                                  const Link& link, const GemmRates& rates);

// Seconds of one micro-batch's all-to-all over `ranks` of `bytes` per rank: each sends (n - 1)/n
// of them, one latency per peer.
double all_to_all_seconds(double bytes, int ranks, const Link& link);

// Forward and backward seconds of expert parallelism's token exchanges for one micro-batch whose
// routed part runs `tokens` on this rank (its share of the tensor-parallel group's: parallel/expert/),
// its MoE layers' and multi-token prediction blocks'.
double expert_parallel_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, int ep,
                               const Link& link);

}  // namespace loom::plan
