#include "loom/plan/activation_memory.h"

#include <algorithm>
#include <string>

#include "loom/kernels/ssd_scan_work.h"
#include "loom/model/linear_precision.h"
#include "loom/model/moe_dispatch.h"
#include "loom/model/multi_token_prediction.h"
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

// The ranges of layers a rank runs: its chunks, and with the head its multi-token prediction
// depths' blocks (widths index layers + depth - 1).
std::vector<model::LayerRange> with_mtp_blocks(const config::ModelConfig& model,
                                               const std::vector<model::LayerRange>& chunks, int64_t head_rows) {
  std::vector<model::LayerRange> out = chunks;
  if (head_rows > 0 && model.mtp_depths > 0) out.push_back({model.layers, model.layers + model.mtp_depths});
  return out;
}

// The rows a MoE layer dispatches on this rank: its share of the group's tokens' selections.
int64_t dispatched_rows(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  return routed_rows(model, w, w.share_of(a.rows()));
}

// The rows a MoE layer's experts on this rank compute: at balanced routing what the rank dispatches.
int64_t expert_rows(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  return dispatched_rows(model, w, a);
}

// A MoE layer's saved tensors (MoeLayer::Saved): the router's over the whole group, the rest over
// this rank's share of its tokens.
int64_t moe_saved_bytes(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  const int64_t rows = a.rows(), share = w.share_of(rows), e = a.element_bytes, C = model.d_model,
                W = w.expert_width;
  const int64_t routed = dispatched_rows(model, w, a), computed = expert_rows(model, w, a);
  int64_t bytes = 0;
  if (a.sequence_parallel && a.tp > 1) bytes += rows * C * e;        // the group's gathered rows
  bytes += rows * w.experts * e + routed * (4 + e);                   // router logits; row tokens and weights
  bytes += rows * model.moe.top_k * 12;  // each selection's expert, weight and dispatched row (the router's backward)
  bytes += (w.latent > 0 ? share * W * e : 0) + 2 * routed * W * e;  // latent; dispatched and returned rows
  bytes += share * W * e;                                              // combined
  if (a.ep > 1) bytes += computed * W * e;                              // the experts' regrouped input
  bytes += w.padded_expert_rows(computed) *
           (w.expert_hidden() * a.expert_hidden_bytes + w.expert_ffn * a.expert_bytes);  // hidden, act
  if (w.shared_ffn > 0) {
    bytes += rows * (w.shared_hidden() * a.mlp_hidden_bytes + w.shared_ffn * a.mlp_bytes);
    bytes += rows * (C + w.shared_ffn) * a.input_code_bytes;
    if (w.shared_gate) bytes += a.local_rows() * (C * e + 4);  // the shared expert's output before its gate, the gate
  }
  return bytes;
}

// A multi-token prediction depth's tensors besides its block (MtpDepth::Saved): its three norms
// (enorm, hnorm, final_layernorm), the shifted tokens' embeddings, the combined rows (all of them
// too under sequence parallelism), eh_proj's output, the block's output, and the shared head's
// input and logits.
int64_t mtp_depth_bytes(const config::ModelConfig& model, int64_t head_rows, const ActivationShape& a) {
  const int64_t local = a.local_rows() * model.d_model * a.element_bytes;
  const bool gathered = a.sequence_parallel && a.tp > 1;
  int64_t bytes = 3 * norm_bytes(model, a, a.element_bytes) + 5 * local;  // embedded, combined (2), block_in, block_out
  if (gathered) bytes += 3 * a.rows() * model.d_model * a.element_bytes;  // combined over all rows, head input
  return bytes + a.rows() * head_rows * a.logit_bytes;
}

// The MoE layers' shared scratch (model::MoeScratch), each buffer as large as the layer needing
// the most of it.
int64_t moe_scratch_bytes(const config::ModelConfig& model, const std::vector<LayerWidths>& widths,
                          const std::vector<model::LayerRange>& chunks, const ActivationShape& a) {
  const int64_t rows = a.rows(), local = a.local_rows(), e = a.element_bytes, C = model.d_model;
  const bool exchange = a.ep > 1;
  auto largest = [&](auto f) {
    return max_over_layers(widths, chunks, [&](const LayerWidths& w) { return w.has_moe() ? f(w) : 0; });
  };
  auto share = [&](const LayerWidths& w) { return w.share_of(rows); };
  auto routed = [&](const LayerWidths& w) { return dispatched_rows(model, w, a); };
  auto computed = [&](const LayerWidths& w) { return expert_rows(model, w, a); };
  int64_t bytes = 0;
  if (exchange) bytes += 2 * largest([&](const LayerWidths& w) { return computed(w) * w.expert_width * e; });
  bytes += largest([&](const LayerWidths& w) {  // out_full: the latent's up projection; the dispatched gradient
    return std::max(w.latent > 0 ? share(w) * C * e : 0, exchange ? routed(w) * w.expert_width * e : 0);
  });
  bytes += largest([&](const LayerWidths& w) { return share(w) * C * e; });  // d_x_full
  // whole: every rank's share gathered into every row (tensor parallel without sequence parallelism)
  bytes += largest([&](const LayerWidths& w) { return share(w) < local ? rows * C * e : 0; });
  bytes += largest([&](const LayerWidths& w) { return w.latent > 0 ? share(w) * w.latent * e : 0; });  // d_y
  bytes += largest([&](const LayerWidths& w) { return routed(w) * w.expert_width * e; });           // d_rows
  bytes += largest([&](const LayerWidths& w) { return (exchange ? computed(w) : routed(w)) * w.expert_width * e; });
  bytes += largest([&](const LayerWidths& w) { return rows * w.experts * e; });  // d_logits
  bytes += largest([&](const LayerWidths& w) {  // ExpertScratch: the padded input, output and input gradient
    const int64_t padded = w.padded_expert_rows(computed(w));
    return padded > computed(w) ? 3 * padded * w.expert_width * e : 0;
  });
  bytes += largest([&](const LayerWidths& w) {  // ExpertScratch's bf16 input and output gradient
    return a.expert_bytes == 2 ? 2 * computed(w) * w.expert_width * 2 : 0;
  });
  bytes += largest([&](const LayerWidths& w) { return w.shared_gate ? local * (C * e + e + 4) : 0; });
  bytes += largest([&](const LayerWidths& w) { return std::max(routed(w), w.shared_gate ? local : 0) * 8; });  // dots
  return bytes;
}

// Multi-token prediction's gradients: each depth's output's, a depth's head's and the embeddings'
// (the Transformer's), and each depth module's block output's, combined rows' and
// halves' (all rows' too under sequence parallelism): one module for a repeated layer.
int64_t mtp_gradient_bytes(const config::ModelConfig& model, const ActivationShape& a) {
  if (model.mtp_depths == 0) return 0;
  const int64_t local = a.local_rows() * model.d_model * a.element_bytes;
  const int64_t all = a.sequence_parallel && a.tp > 1 ? 2 * a.rows() * model.d_model * a.element_bytes : 0;
  const int modules = model.mtp_use_repeated_layer ? 1 : model.mtp_depths;
  return (model.mtp_depths + 2) * local + modules * (4 * local + all);
}

// A linear layer's GEMM on this rank: its rows (tokens) and its weight's output and input features.
struct LinearShape {
  int64_t rows = 0, out = 0, in = 0;
};

// Every linear of a layer that runs through a precision recipe (LinearPrecision): attention's
// q/k/v and output projections, a dense MLP's or the shared expert's two, a Mamba-2 mixer's in and
// out projections, each routed expert's two over its rows (at balanced routing: the rows the
// rank's experts compute, evenly), a latent MoE layer's two latent projections (over all rows);
// routers stay fp32.
std::vector<LinearShape> precision_linears(const config::ModelConfig& model, const LayerWidths& w,
                                           const ActivationShape& a) {
  const int64_t rows = a.rows(), C = model.d_model;
  std::vector<LinearShape> out;
  if (w.has_attention()) out.insert(out.end(), {{rows, w.qkv(), C}, {rows, C, w.q}});
  if (w.has_mlp()) out.insert(out.end(), {{rows, w.hidden(), C}, {rows, C, w.ffn}});
  if (w.shared_ffn > 0) out.insert(out.end(), {{rows, w.shared_hidden(), C}, {rows, C, w.shared_ffn}});
  if (w.has_mamba()) out.insert(out.end(), {{rows, w.mamba_proj(), C}, {rows, C, w.mamba_inner}});
  if (w.has_moe() && w.local_experts > 0) {
    const int64_t each = w.padded_expert_rows(expert_rows(model, w, a)) / w.local_experts;
    out.insert(out.end(), {{each, w.expert_hidden(), w.expert_width}, {each, w.expert_width, w.expert_ffn}});
  }
  if (w.has_moe() && w.latent > 0) out.insert(out.end(), {{rows, w.latent, C}, {rows, C, w.latent}});
  return out;
}

// The precision recipe's copies of a GEMM's operands (model::PrecisionScratch): the quantized
// input, weight and output gradient, an output before it is rounded and added (the projections
// adding into the residual stream and the input gradients adding into the normed stream's, rows x
// d_model; wgrad's into the main gradient, out x in), and under fp8_blockwise wgrad's transposed
// operand; each buffer as large as the linear (the head's included) needing most of it.
int64_t precision_scratch_bytes(const config::RunConfig& config, const std::vector<LayerWidths>& widths,
                                const std::vector<model::LayerRange>& chunks, int64_t head_rows,
                                const ActivationShape& a) {
  const int64_t rows = a.rows(), C = config.model.d_model;
  std::vector<LinearShape> linears;
  for (const model::LayerRange& c : chunks) {
    for (int l = c.first; l < c.last; ++l) {
      for (const LinearShape& s : precision_linears(config.model, widths[static_cast<size_t>(l)], a)) {
        linears.push_back(s);
      }
    }
  }
  if (head_rows > 0) linears.push_back({rows, head_rows, C});
  int64_t input = 0, weight = 0, out_grad = 0, output = rows * C, transposed = 0;
  for (const LinearShape& s : linears) {
    input = std::max(input, s.rows * s.in);
    weight = std::max(weight, s.out * s.in);
    out_grad = std::max(out_grad, s.rows * s.out);
    output = std::max(output, s.out * s.in);
    transposed = std::max({transposed, s.rows * s.in, s.rows * s.out});
  }
  if (config.precision.recipe != config::PrecisionRecipe::Fp8Blockwise) transposed = 0;
  return (input + weight + out_grad + output + transposed) * a.element_bytes;
}

}  // namespace

int64_t routed_rows(const config::ModelConfig& model, const LayerWidths& w, int64_t tokens) {
  if (!w.has_moe()) return 0;
  const int64_t selections = tokens * model.moe.top_k;
  const int64_t capacity =
      model::expert_capacity(tokens, model.moe.top_k, static_cast<int>(w.experts), model.moe.capacity_factor);
  return capacity > 0 ? std::min(selections, capacity * w.experts) : selections;
}

int64_t context_attention_bytes(const std::vector<LayerWidths>& widths, const std::vector<model::LayerRange>& chunks,
                                const ActivationShape& a) {
  if (a.cp <= 1) return 0;
  const int64_t rows = a.rows(), e = a.element_bytes;
  const auto largest = [&](auto f) { return max_over_layers(widths, chunks, f); };
  // parallel::HeadExchange, shared by Ulysses attention and the Mamba-2 mixers: its send and
  // receive blocks (cp blocks of a rank's rows x its share of the heads) as wide as the widest rows
  // it moves: the rank's fused q/k/v (all-to-all attention), a mixer's in_proj outputs.
  const int64_t qkv = a.cp_all_to_all ? largest([](const LayerWidths& w) { return w.qkv(); }) : 0;
  const int64_t mamba_proj = largest([](const LayerWidths& w) { return w.mamba_proj(); });
  int64_t bytes = 2 * rows * std::max(qkv, mamba_proj) * e;
  // A mixer's rows of in_proj and its whole sequences' gated output (ParallelScratch::mixer_proj,
  // mixer_gated; their gradients in backward).
  bytes += largest([&](const LayerWidths& w) { return rows * (w.mamba_proj() + w.mamba_inner) * e; });
  if (a.cp_all_to_all) {
    // parallel::UlyssesAttention: backward's output gradient and q/k/v gradient of its heads over
    // the whole sequence.
    return bytes + largest([&](const LayerWidths& w) { return rows * (w.qkv() + w.q) * e; });
  }
  // parallel::RingAttention: the key/value block held and the one arriving, their gradients
  // likewise, and a block's partial output and log-sum-exp before they are merged.
  return bytes + largest([&](const LayerWidths& w) {
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

BlockSavedParts block_saved_parts(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  const int64_t rows = a.rows(), e = a.element_bytes, stream = a.local_rows() * model.d_model * e;
  BlockSavedParts p;
  if (w.has_attention()) {
    p.norm1 = norm_bytes(model, a, a.normed_bytes);
    p.mid = stream;
    p.attention = rows * (w.qkv() + w.q) * a.attention_bytes;                 // q/k/v, attention output
    p.attention += a.batch * w.heads * a.seq * e;                               // log-sum-exp
    if (a.attention_probs) p.attention += a.batch * w.heads * a.seq * a.seq * a.cp * e;  // probabilities (every key)
    if (a.cp > 1 && a.cp_all_to_all) p.attention += rows * (w.qkv() + w.q) * e;  // its heads' q/k/v and output
    p.attention += rows * (model.d_model + w.q) * a.input_code_bytes;          // q/k/v and o_proj inputs' codes
  }
  if (w.has_mlp()) {
    p.norm2 = norm_bytes(model, a, a.normed_bytes);
    p.mlp = rows * (w.hidden() * a.mlp_hidden_bytes + w.ffn * a.mlp_bytes);
    p.mlp += rows * (model.d_model + w.ffn) * a.input_code_bytes;  // up and down projections' inputs' codes
  }
  if (w.has_mamba()) {  // Mamba2Mixer::Saved (fp32) behind a plain norm
    p.norm1 = norm_bytes(model, a, e);
    p.mid = stream;
    p.mamba = rows * (w.mamba_proj() + w.mamba_conv() + 2 * w.mamba_inner + w.mamba_groups) * e;  // + y, gated, rstd
  }
  if (w.has_moe()) {
    p.norm2 = norm_bytes(model, a, e);
    p.moe = moe_saved_bytes(model, w, a);
  }
  return p;
}

int64_t block_saved_bytes(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a) {
  const BlockSavedParts p = block_saved_parts(model, w, a);
  return p.norm1 + p.mid + p.attention + p.mamba + p.norm2 + p.mlp + p.moe;
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
    for (int l = model.layers; l < model.layers + model.mtp_depths; ++l) {
      bytes += mtp_depth_bytes(model, head_rows, a);
      if (!model.recompute) bytes += block_saved_bytes(model, widths[static_cast<size_t>(l)], a);
    }
  }
  return bytes;
}

namespace {

// On a GPU each call of the Mamba-2 scan takes its work arrays from the device's scratch for its
// length (the loops form, LOOM_SSD_SCAN's default: kernels/ssd_scan_work.h; the chunk-parallel
// forms at most 256 MiB), the backward's the larger: the widest mixer's, over whole sequences of
// the micro-batch (a mixer under context parallelism scans whole sequences).
int64_t gpu_scan_work_bytes(const config::RunConfig& config, const std::vector<LayerWidths>& widths,
                            const std::vector<model::LayerRange>& chunks) {
  return max_over_layers(widths, chunks, [&](const LayerWidths& w) -> int64_t {
    if (!w.has_mamba()) return 0;
    kernels::SsdShape s{};
    s.batch = config.train.micro_batch;
    s.seq = config.data.seq_len;
    s.heads = w.mamba_heads;
    s.head_dim = w.mamba_inner / w.mamba_heads;
    s.groups = w.mamba_groups;
    s.state = w.mamba_bc / w.mamba_groups;
    s.chunk = config.model.mamba.chunk_size;
    return kernels::ssd_loops::loops_backward_bytes(s);
  });
}

}  // namespace

int64_t workspace_bytes(const config::RunConfig& config, const std::vector<LayerWidths>& widths,
                        const std::vector<model::LayerRange>& rank_chunks, int64_t head_rows,
                        const ActivationShape& a) {
  const config::ModelConfig& model = config.model;
  const int64_t rows = a.rows(), e = a.element_bytes, C = model.d_model;
  const int64_t stream = a.local_rows() * C * e;
  const std::vector<model::LayerRange> chunks = with_mtp_blocks(model, rank_chunks, head_rows);
  // Backward's gradients of the widest layer (model::Workspace) and of its normed input; the
  // MLP's hidden and activation gradients also serve the experts' and the shared expert's.
  int64_t bytes = stream;
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.q * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.qkv() * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) {
    const int64_t experts = w.padded_expert_rows(expert_rows(model, w, a));
    return std::max({rows * w.hidden(), experts * w.expert_hidden(), rows * w.shared_hidden()}) * e;
  });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) {
    return std::max({rows * w.ffn, w.padded_expert_rows(expert_rows(model, w, a)) * w.expert_ffn,
                     rows * w.shared_ffn}) * e;
  });
  // The Mamba-2 mixers' gradients (Workspace::d_mixer_*): the gated norm's input and the scan's
  // output, the projections', the convolution's.
  bytes += 2 * max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.mamba_inner * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.mamba_proj() * e; });
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return rows * w.mamba_conv() * e; });
  bytes += moe_scratch_bytes(model, widths, chunks, a);
  if (config.runtime.device == config::RuntimeDevice::Cuda) bytes += gpu_scan_work_bytes(config, widths, chunks);
  if (head_rows > 0) bytes += mtp_gradient_bytes(model, a);
  // The tiled attention's backward: one row statistic per query and head.
  bytes += max_over_layers(widths, chunks, [&](const LayerWidths& w) { return a.batch * w.heads * a.seq * 4; });
  bytes += context_attention_bytes(widths, chunks, a);
  if (model.recompute) {  // one Block::Saved refilled layer by layer (each member as its largest use), its output
    using P = BlockSavedParts;
    for (int64_t P::*member : {&P::norm1, &P::mid, &P::attention, &P::mamba, &P::norm2, &P::mlp, &P::moe}) {
      bytes += max_over_layers(widths, chunks,
                               [&](const LayerWidths& w) { return block_saved_parts(model, w, a).*member; });
    }
    bytes += stream;
  }
  if (head_rows > 0) bytes += stream + rows * 4 + (a.tp > 1 ? 3 * rows * 4 : 0);  // d_final, losses, statistics
  if (a.tp > 1) {  // ParallelScratch: partial sums and full-width input gradients; gathered rows (sp)
    const int64_t full = rows * C * e;
    bytes += 2 * full + (a.sequence_parallel ? full + stream : 0);
  }
  if (a.tp > 1 && config.precision.recipe != config::PrecisionRecipe::Fp32) {
    // Kv heads replicated over ranks: their gradients summed over the group before the cast
    // (ParallelScratch::replicated_kv: every kv head's k and v per row).
    const std::vector<model::LayerSpec> specs = model::resolve_layers(model);
    const model::LayerSpec mtp = model::mtp_block_spec(model);
    int64_t replicated = 0;
    for (const model::LayerRange& c : chunks) {
      for (int l = c.first; l < c.last; ++l) {
        const model::LayerSpec& spec = l < model.layers ? specs[static_cast<size_t>(l)] : mtp;
        if (!spec.has_attention || spec.kv_heads >= a.tp) continue;
        replicated = std::max(replicated, rows * spec.kv_heads * 2 * model::head_dim(model) * e);
      }
    }
    bytes += replicated;
  }
  if (config.precision.recipe != config::PrecisionRecipe::Fp32) {
    bytes += precision_scratch_bytes(config, widths, chunks, head_rows, a);
  }
  return bytes;
}

namespace {

// Per unit as the Transformer numbers them (the embedding 0, layer l l + 1, the head's: the final
// norm, the head, multi-token prediction, layers + 1), the elements of its parameters that
// several tensor-parallel ranks hold and sum (TpGradSync::SumOverHolders): this rank's, and
// their global tensors'.
struct UnitGradientSums {
  std::vector<int64_t> local, global;
};

UnitGradientSums unit_gradient_sums(const std::vector<model::Parameter>& params, int layers) {
  UnitGradientSums u{std::vector<int64_t>(static_cast<size_t>(layers + 2), 0),
                     std::vector<int64_t>(static_cast<size_t>(layers + 2), 0)};
  const std::string layer_prefix = "model.layers.";
  for (const model::Parameter& p : params) {
    if (p.shard.grad_sync != model::TpGradSync::SumOverHolders) continue;
    int unit = layers + 1;
    if (p.name.rfind(layer_prefix, 0) == 0) unit = 1 + std::stoi(p.name.substr(layer_prefix.size()));
    if (p.name.rfind("model.embed_tokens.", 0) == 0) unit = 0;
    u.local[static_cast<size_t>(unit)] += p.numel;
    u.global[static_cast<size_t>(unit)] += shape_numel(p.global_shape());
  }
  return u;
}

}  // namespace

int64_t tensor_parallel_gradient_sum_bytes(const std::vector<model::Parameter>& params, int layers, int tp) {
  if (tp <= 1) return 0;
  const UnitGradientSums u = unit_gradient_sums(params, layers);
  const int64_t stash = *std::max_element(u.local.begin(), u.local.end());
  const int64_t sum = *std::max_element(u.global.begin(), u.global.end());
  return (stash + sum) * static_cast<int64_t>(sizeof(float));
}

std::vector<int64_t> tensor_parallel_gradient_sums(const std::vector<model::Parameter>& params, int layers, int tp) {
  std::vector<int64_t> sums;
  if (tp <= 1) return sums;
  for (const int64_t global : unit_gradient_sums(params, layers).global) {
    if (global > 0) sums.push_back(global);
  }
  return sums;
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
    // The weights a LinearPrecision casts: attention's, the MLPs' (dense, shared and routed
    // experts') and the Mamba-2 mixers' projections; not the latent projections nor MTP's eh_proj.
    bool linear = n.find(".mixer.in_proj_") != std::string::npos;
    for (const char* suffix : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                               ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight", ".out_proj.weight"}) {
      linear = linear || n.ends_with(suffix);
    }
    if (!linear) continue;
    bytes += per_element * p.numel;
  }
  return bytes;
}

}  // namespace loom::plan
