#include "loom/plan/device_shapes.h"

#include <string>

#include "loom/core/error.h"
#include "loom/model/linear_precision.h"
#include "loom/plan/block_linears.h"

namespace loom::plan {

namespace {

std::string role_name(LinearRole role) {
  switch (role) {
    case LinearRole::AttentionQkv: return "attention's q/k/v projection";
    case LinearRole::AttentionOut: return "attention's output projection";
    case LinearRole::MlpUp: return "the MLP's up projection";
    case LinearRole::MlpDown: return "the MLP's down projection";
    case LinearRole::Plain: return "a Mamba-2 mixer's or shared expert's projection";
    case LinearRole::ExpertUp: return "a routed expert's up projection";
    case LinearRole::ExpertDown: return "a routed expert's down projection";
    case LinearRole::Latent: return "a latent projection";
    case LinearRole::Replicated: return "eh_proj";
  }
  return "a linear";
}

}  // namespace

void check_device_gemm_shapes(const config::RunConfig& config, const StageMemory& stage, int64_t tokens) {
  if (config.runtime.device != config::RuntimeDevice::Cuda) return;
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  const int layers = config.model.layers;
  auto check = [&](int l, const std::string& where) {
    const model::Recipe r = entry_recipe(policy, l, layers);
    const int64_t m = model::device_gemm_multiple(r);
    if (m == 1) return;
    auto visit = [&](double out, double in, model::Recipe linear, LinearRole role, double) {
      if (model::device_gemm_multiple(linear) == 1) return;  // a 16-bit linear of an FP8 block (latent)
      const auto o = static_cast<int64_t>(out), i = static_cast<int64_t>(in);
      const bool rows = is_expert(role) || tokens % m == 0;  // experts' rows are padded
      if (rows && o % m == 0 && i % m == 0) return;
      throw Error("precision.recipe=" + model::recipe_name(r) + " on runtime.device=cuda: cuBLASLt's FP8 products " +
                  "need every GEMM dimension a multiple of " + std::to_string(m) + ", and " + where + "'s " +
                  role_name(role) + " is " + std::to_string(o) + " x " + std::to_string(i) +
                  " (output x input features on this rank) over " + std::to_string(tokens) +
                  " tokens per micro-batch (use widths, parallel.tp and train.micro_batch x data.seq_len / "
                  "parallel.cp that give multiples of " + std::to_string(m) + ", or precision.recipe=bf16)");
    };
    visit_layer_linears(config, stage.widths[static_cast<size_t>(l)], r, static_cast<double>(tokens), visit);
  };
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) check(l, "layer " + std::to_string(l));
  }
  if (stage.head_rows == 0) return;
  for (int k = 0; k < config.model.mtp_depths; ++k) {
    check(layers + k, "multi-token prediction depth " + std::to_string(k + 1));
  }
}

}  // namespace loom::plan
