#include "loom/plan/activation_memory.h"

#include <algorithm>
#include <string>

#include "loom/model/linear_precision.h"
#include "loom/parallel/data/bf16_parameter_copy.h"

namespace loom::plan {

namespace {

// A norm's output (`out_bytes` per element) and statistics.
int64_t norm_bytes(const config::ModelConfig& model, const ActivationShape& a, int64_t out_bytes) {
  const int64_t stats = model.norm == config::Norm::Layer ? 2 : 1;  // rstd (and mean)
  return a.local_rows() * model.d_model * out_bytes + stats * a.local_rows() * a.element_bytes;
}

template <typename F>
int64_t max_over_layers(const std::vector<LayerWidths>& widths, const std::vector<model::LayerRange>& chunks, F f) {
  int64_t best = 0;
  for (const model::LayerRange& c : chunks) {
    for (int l = c.first; l < c.last; ++l) best = std::max(best, f(widths[static_cast<size_t>(l)]));
  }
  return best;
}

}  // namespace

int64_t context_attention_bytes(const std::vector<LayerWidths>& widths, const std::vector<model::LayerRange>& chunks,
                                const ActivationShape& a) {
  if (a.cp <= 1) return 0;
  const int64_t rows = a.rows(), e = a.element_bytes;
  if (a.cp_all_to_all) {
    // parallel::UlyssesAttention: the all-to-all's send and receive blocks (cp blocks of a rank's
    // rows x its share of the heads: as large as the rank's fused q/k/v), and backward's output
    // gradient and q/k/v gradient of its heads over the whole sequence.
    return max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * (3 * w.qkv() + w.q) * e; });
  }
  // parallel::RingAttention: the key/value block held and the one arriving, their gradients
  // likewise, and a block's partial output and log-sum-exp before they are merged.
  return max_over_layers(widths, chunks, [&](const LayerWidths& w) {
    return rows * (4 * 2 * w.kv + w.q) * e + a.batch * w.heads * a.seq * e;
  });
}

bool bf16_logits_on_device(const config::RunConfig& config, int tp) {
  return config.runtime.device == config::RuntimeDevice::Cuda && tp == 1 &&
         model::PrecisionPolicy::from_config(config.precision).head_recipe() == model::Recipe::Bf16;
}

bool bf16_mlp_on_device(const config::RunConfig& config) {
  return config.runtime.device == config::RuntimeDevice::Cuda &&
         config.precision.recipe == config::PrecisionRecipe::Bf16;
}

bool bf16_normed_on_device(const config::RunConfig& config) { return bf16_mlp_on_device(config); }

bool bf16_mlp_hidden_on_device(const config::RunConfig& config) {
  const config::PrecisionRecipe r = config.precision.recipe;
  return config.runtime.device == config::RuntimeDevice::Cuda && r != config::PrecisionRecipe::Fp32 &&
         r != config::PrecisionRecipe::Fp16;
}

bool bf16_attention_on_device(const config::RunConfig& config) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  return (bf16_mlp_on_device(config) || fp8_input_codes_on_device(config)) &&
         policy.attention_operands() == kernels::AttentionOperands::Bf16 && config.parallel.cp <= 1;
}

bool fp8_input_codes_on_device(const config::RunConfig& config) {
  return config.runtime.device == config::RuntimeDevice::Cuda &&
         (config.precision.recipe == config::PrecisionRecipe::Fp8Delayed ||
          config.precision.recipe == config::PrecisionRecipe::Fp8Current);
}

bool fp8_normed_codes_on_device(const config::RunConfig& config, int tp) {
  return fp8_input_codes_on_device(config) && !(config.parallel.sequence_parallel && tp > 1);
}

bool fp8_mlp_codes_on_device(const config::RunConfig& config) {
  return fp8_input_codes_on_device(config) && !config.model.bias;
}

int64_t block_saved_bytes(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  const int64_t rows = a.rows(), e = a.element_bytes;
  int64_t bytes = 0;
  if (w.has_attention()) {
    bytes += norm_bytes(model, a, a.normed_bytes) + a.local_rows() * model.d_model * e;  // norm1, mid
    bytes += rows * (w.qkv() + w.q) * a.attention_bytes;                  // q/k/v, attention output
    bytes += a.batch * w.heads * a.seq * e;                                // log-sum-exp
    if (a.attention_probs) bytes += a.batch * w.heads * a.seq * a.seq * a.cp * e;  // probabilities (every key)
    if (a.cp > 1 && a.cp_all_to_all) bytes += rows * (w.qkv() + w.q) * e;  // its heads' q/k/v and output
    bytes += rows * (model.d_model + w.q) * a.input_code_bytes;             // q/k/v and o_proj inputs' codes
  }
  if (w.has_mlp()) {
    bytes += norm_bytes(model, a, a.normed_bytes) + rows * (w.hidden() * a.mlp_hidden_bytes + w.ffn * a.mlp_bytes);
    bytes += rows * (model.d_model + w.ffn) * a.input_code_bytes;  // up and down projections' inputs' codes
  }
  return bytes;
}

int64_t micro_batch_activation_bytes(const config::ModelConfig& model, const std::vector<LayerWidths>& widths,
                                     const std::vector<model::LayerRange>& chunks, int64_t head_rows,
                                     const ActivationShape& a) {
  const int64_t stream = a.local_rows() * model.d_model * a.element_bytes;
  int64_t bytes = stream;  // the gradient of the running residual stream (d_x)
  for (const model::LayerRange& c : chunks) {
    bytes += (c.last - c.first + 1) * stream;  // the stream before each layer and after the last
    if (model.recompute) continue;              // blocks recompute what they saved
    for (int l = c.first; l < c.last; ++l) bytes += block_saved_bytes(model, widths[static_cast<size_t>(l)], a);
  }
  if (chunks.front().first == 0) bytes += a.local_rows() * 4;  // position ids (int32)
  if (head_rows > 0) {
    bytes += norm_bytes(model, a, a.element_bytes) + a.rows() * head_rows * a.logit_bytes;
    if (a.sequence_parallel && a.tp > 1) bytes += a.rows() * model.d_model * a.element_bytes;
  }
  return bytes;
}

int64_t workspace_bytes(const config::RunConfig& config, const std::vector<LayerWidths>& widths,
                        const std::vector<model::LayerRange>& chunks, int64_t head_rows, const ActivationShape& a) {
  const config::ModelConfig& model = config.model;
  const int64_t rows = a.rows(), e = a.element_bytes, C = model.d_model;
  const int64_t stream = a.local_rows() * C * e;
  // Backward's gradients of the widest layer (model::Workspace) and of its normed input.
  int64_t bytes = stream;
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.q * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.qkv() * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.hidden() * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.ffn * e; });
  // The tiled attention's backward: one row statistic per query and head.
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return a.batch * w.heads * a.seq * 4; });
  bytes += context_attention_bytes(widths, chunks, a);
  if (model.recompute) {  // one set of saved tensors, refilled layer by layer, and its output
    bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return block_saved_bytes(model, w, a); });
    bytes += stream;
  }
  if (head_rows > 0) bytes += stream + rows * 4 + (a.tp > 1 ? 3 * rows * 4 : 0);  // d_final, losses, statistics
  if (a.tp > 1) {  // ParallelScratch: partial sums and full-width input gradients; gathered rows (sp)
    const int64_t full = rows * C * e;
    bytes += 2 * full + (a.sequence_parallel ? full + stream : 0);
  }
  if (config.precision.recipe != config::PrecisionRecipe::Fp32) {
    // Quantized copies of a GEMM's input, weight and output gradient, and its rounded output.
    const int64_t widest = max_over_layers(widths, chunks, [&](const LayerWidths& w) {
      return std::max({w.qkv(), w.hidden(), C});
    });
    const int64_t deepest = std::max(widest, head_rows);
    bytes += (rows * std::max<int64_t>(C, widest) + deepest * C + rows * deepest + rows * deepest) * e;
  }
  return bytes;
}

int64_t weight_cast_cache_bytes(const config::RunConfig& config, const std::vector<model::Parameter>& params,
                                int64_t head_rows) {
  const config::PrecisionRecipe recipe = config.precision.recipe;
  if (config.runtime.device != config::RuntimeDevice::Cuda || recipe == config::PrecisionRecipe::Fp32) return 0;
  // The optimizer's bf16 copy of the parameters serves every bf16 cast (the head's; all under bf16).
  // (fp8_delayed's FP8 weights' codes at ZeRO 0 are the optimizer's, held all the time rather than
  // during each step: the same bytes, counted here.)
  const bool copy = parallel::keeps_bf16_parameter_copy(config);
  if (copy && recipe == config::PrecisionRecipe::Bf16) return 0;
  const int64_t per_element = recipe == config::PrecisionRecipe::Mxfp8 ? 4 : 2;
  int64_t bytes = copy ? 0 : head_rows * config.model.d_model * 2;
  for (const model::Parameter& p : params) {
    const std::string& n = p.name;
    const std::string suffix = "_proj.weight";
    const bool linear = n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
    if (linear && n.find(".experts.") == std::string::npos) bytes += per_element * p.numel;  // routed experts: fp32
  }
  return bytes;
}

}  // namespace loom::plan
