#pragma once
// Training FLOPs per token (3x the forward's GEMMs, attention's score and value products and
// Mamba-2's scan included), per layer and for the output head: the MFU numerator and the cost model of
// cost-balanced pipeline partitioning.
#include <cstdint>

#include "loom/model/layer_spec.h"
#include "loom/config/run_config.h"

namespace loom::model {

double layer_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq);
// Of those, attention's score and value products over the causal prefix (no projections): the
// part a fused attention kernel computes, at a rate of its own (plan/time_plan.cpp).
double attention_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq);
// The head, and with model.mtp_depths each multi-token prediction depth (eh_proj, its block and
// the shared head again) at sequence length `seq`.
double head_training_flops_per_token(const config::ModelConfig& config, int64_t seq);

}  // namespace loom::model
