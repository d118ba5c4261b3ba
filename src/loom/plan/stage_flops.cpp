#include "loom/plan/stage_flops.h"

#include "loom/model/flops.h"
#include "loom/model/linear_precision.h"
#include "loom/model/multi_token_prediction.h"
#include "loom/plan/block_linears.h"
#include "loom/plan/layer_widths.h"

namespace loom::plan {

Fp8Flops fp8_linear_flops_per_token(const config::RunConfig& config, const StageMemory& stage) {
  Fp8Flops f;
  for_each_block_linear(config, stage, 1.0, [&](double out, double in, model::Recipe r, LinearRole role, double rows) {
    if (!model::is_fp8(r) || r == model::Recipe::Mxfp8) return;
    (is_expert(role) ? f.experts : f.split) += 6.0 * rows * out * in;
  });
  return f;
}

double expert_padding_flops(const config::RunConfig& config, const StageMemory& stage) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  const int layers = config.model.layers;
  double flops = 0.0;
  auto add = [&](int l) {
    const LayerWidths& w = stage.widths[static_cast<size_t>(l)];
    if (!w.has_moe() || w.local_experts == 0 || !model::is_fp8(entry_recipe(policy, l, layers))) return;
    const double rows = static_cast<double>(w.local_experts * (w.expert_row_multiple - 1));
    flops += 6.0 * rows * static_cast<double>(w.expert_hidden() * w.expert_width + w.expert_width * w.expert_ffn);
  };
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) add(l);
  }
  if (stage.head_rows > 0) {
    for (int l = layers; l < layers + config.model.mtp_depths; ++l) add(l);
  }
  return flops;
}

double replicated_linear_flops_per_token(const config::RunConfig& config, const StageMemory& stage) {
  double weights = 0.0;
  for_each_block_linear(config, stage, 1.0, [&](double out, double in, model::Recipe, LinearRole role, double rows) {
    if (role == LinearRole::Replicated) weights += rows * out * in;
  });
  return 6.0 * weights;
}

StageFlops stage_flops(const config::RunConfig& config, const StageMemory& stage,
                       const std::vector<model::LayerSpec>& specs) {
  const config::ModelConfig& model = config.model;
  const int64_t seq = config.data.seq_len;
  StageFlops f;
  auto add_block = [&](const model::LayerSpec& spec, double count) {
    f.block += count * model::layer_training_flops_per_token(model, spec, seq);
    f.attention += count * model::attention_training_flops_per_token(model, spec, seq);
    f.scan += count * model::ssd_scan_training_flops_per_token(model, spec, seq);
    const model::MoeTrainingFlops moe = model::moe_training_flops_per_token(model, spec);
    const double gate = config.parallel.sequence_parallel ? 0.0 : moe.shared_gate;
    // The router's forward (a third of its FLOPs) over the whole group on every rank; its
    // backward, the latent projections and the experts over this rank's share of the tokens.
    f.replicated += count * (moe.router / 3.0 + gate);
  };
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) add_block(specs[static_cast<size_t>(l)], 1.0);
  }
  if (stage.chunks.back().last != model.layers) return f;
  const model::LayerSpec mtp = model::mtp_block_spec(model);
  const double depths = model.mtp_depths, d = model.d_model;
  add_block(mtp, depths);
  const double block = model::layer_training_flops_per_token(model, mtp, seq), eh_proj = 3.0 * 2.0 * (2.0 * d) * d;
  f.head = model::head_training_flops_per_token(model, seq) - depths * (block + eh_proj);
  return f;
}

}  // namespace loom::plan
