#pragma once
// Training FLOPs per token (3x the forward's GEMMs, attention's score and value products and
// Mamba-2's scan included), per layer and for the output head: the MFU numerator and the cost model of
// cost-balanced pipeline partitioning.
#include <cstdint>

#include "loom/model/layer_spec.h"
#include "loom/config/run_config.h"

namespace loom::model {

double layer_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq);
// Of those, a MoE layer's parts (all 0 for another layer): its router, latent projections, top_k
// routed experts, shared expert and the shared expert's gate. The router, the latent projections
// and the routed experts are tensor-parallel replicated (MoeLayer: every rank computes them over
// all the group's tokens), the shared expert split like a dense MLP (plan/time_plan.cpp).
struct MoeTrainingFlops {
  double router = 0.0, latent = 0.0, experts = 0.0, shared = 0.0, shared_gate = 0.0;
  double total() const { return router + latent + experts + shared + shared_gate; }
};
MoeTrainingFlops moe_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec);
// Of those, attention's score and value products over the causal prefix (no projections): the
// part a fused attention kernel computes, at a rate of its own (plan/time_plan.cpp).
double attention_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq);
// Of a Mamba-2 mixer's forward per token, the chunked scan's: C_t . B_j and the weighted sum over
// the block's causal prefix ((min(chunk, seq) + 1) / 2 tokens on average), the entering state's
// read and the state's update. Its training FLOPs count 3x this, as the layer's do.
double ssd_scan_forward_flops_per_token(int64_t heads, int64_t head_dim, int64_t groups, int64_t state, int64_t chunk,
                                        int64_t seq);
// A layer's training FLOPs of that scan per token (0 without a Mamba-2 mixer): the part the scan
// kernels compute, in double, at a rate of their own (plan/time_plan.cpp).
double ssd_scan_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq);
// The head, and with model.mtp_depths each multi-token prediction depth (eh_proj, its block and
// the shared head again) at sequence length `seq`.
double head_training_flops_per_token(const config::ModelConfig& config, int64_t seq);

}  // namespace loom::model
