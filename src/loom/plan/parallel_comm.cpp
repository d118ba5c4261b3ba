#include "loom/plan/parallel_comm.h"

#include <algorithm>

#include "loom/model/linear_precision.h"
#include "loom/plan/time_plan.h"

namespace loom::plan {

namespace {

// A block's (a layer's or a multi-token prediction depth's), `stream` the elements of the residual
// stream's rows. Each region from a column- to a row-parallel linear (attention; a dense MLP; a
// Mamba-2 mixer, in_proj to out_proj; a MoE layer's shared expert, reduced on its own) sums its
// output over the group forward (g: an all-reduce; sequence parallel: a reduce-scatter, after f's
// all-gather of its input) and its input's gradient backward (f: an all-reduce; sequence
// parallel: a reduce-scatter, after g's all-gather of the output's gradient and the column-parallel
// wgrad's input gathered again, but where that layer kept its input's FP8 codes: per-tensor FP8 on
// a GPU, in attention and the MLPs, never in the mixer). A MoE layer's routed part (every rank
// routes all the group's tokens, then runs its share of them: TensorParallel::row_part): under sequence
// parallelism its input rows gathered forward, and nothing backward (each rank's share is its own
// rows); without, the shares' outputs forward and their input gradients backward gathered into
// every row (an all-gather each: each row is one rank's). All fp32 (kCommBytes) but
// attention's and a dense MLP's input gathers where their norms write bf16 rows (kBf16GatherBytes).
// With parallel.overlap_tp_comm a region's column-parallel layer (q/k/v, up, in_proj, the shared
// expert's up) hides its input's second gather behind its dgrad GEMM and its input gradient's sum
// behind its wgrad GEMM, each GEMM 2 rows x its out x d_model FLOPs at `rates`.
TpSeconds block_tp_seconds(const config::RunConfig& config, const LayerWidths& w, model::Recipe r, double stream,
                           int tp, const Link& link, const GemmRates& rates) {
  const int routed = w.has_moe();
  const bool sp = config.parallel.sequence_parallel;
  const bool device = config.runtime.device == config::RuntimeDevice::Cuda;
  const bool kept_codes = sp && device && (r == model::Recipe::Fp8Delayed || r == model::Recipe::Fp8Current);
  // The inputs gathered in bf16, forward and again backward: attention's and a dense MLP's (Block's
  // normed_input; the MoE layer's shared expert takes its norm's fp32 rows, as the mixer does).
  const bool bf16_rows = sp && device && r == model::Recipe::Bf16;
  const double reduce = sp ? all_gather_seconds(stream * kCommBytes, tp, link)  // a reduce-scatter costs the same
                           : all_reduce_seconds(stream * kCommBytes, tp, link);
  const double gather = all_gather_seconds(stream * kCommBytes, tp, link);
  const double bf16_gather = all_gather_seconds(stream * kBf16GatherBytes, tp, link);
  TpSeconds t;
  auto column_layer = [&](bool present, int64_t out, bool bf16_input, bool regathered) {
    if (!present) return;
    const double input = bf16_input ? bf16_gather : gather, again = sp && regathered ? input : 0.0;
    t.forward += reduce + (sp ? input : 0.0);
    t.backward += reduce + again + (sp ? gather : 0.0);  // sp: the output's gradient gathered too
    if (!config.parallel.overlap_tp_comm) return;
    const double gemm = 2.0 * stream * static_cast<double>(out) / rates.of(r);
    t.hidden_backward += std::min(again, gemm) + std::min(reduce, gemm);
  };
  column_layer(w.has_attention(), w.qkv(), bf16_rows, !kept_codes);
  column_layer(w.has_mlp(), w.hidden(), bf16_rows, !kept_codes);
  column_layer(w.has_mamba(), w.mamba_proj(), false, true);
  column_layer(w.shared_ffn > 0, w.shared_hidden(), false, !kept_codes);
  // The routed part: sp its input rows gathered forward; else its shares gathered both ways.
  t.forward += routed * gather;
  if (!sp) t.backward += routed * gather;
  return t;
}

}  // namespace

// The stage's: its blocks' (a recompute runs their forward's again in backward); the embedding's
// lookup, its rows summed forward (g; sequence parallel: a reduce-scatter, and an all-gather of
// their gradient backward); the head's input gradient summed backward (f; sequence parallel: a
// reduce-scatter, and its input's all-gather forward); each multi-token prediction depth's lookup
// and head again, and under sequence parallelism its eh_proj's all-gather of the [enorm | hnorm]
// rows forward (2 d_model wide) and of its output's gradient backward; after each unit's backward
// the fp32 all-reduces of the gradients several ranks hold (StageMemory::tp_gradient_sums).
TpSeconds tensor_parallel_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, int tp,
                                  const Link& link, const GemmRates& rates) {
  const model::PrecisionPolicy policy = model::PrecisionPolicy::from_config(config.precision);
  const int layers = config.model.layers;
  const bool sp = config.parallel.sequence_parallel;
  const double stream = tokens * config.model.d_model, bytes = stream * kCommBytes;
  const double reduce = all_reduce_seconds(bytes, tp, link), gather = all_gather_seconds(bytes, tp, link);
  TpSeconds blocks;
  auto add_block = [&](int l, model::Recipe r) {
    const TpSeconds b = block_tp_seconds(config, stage.widths[static_cast<size_t>(l)], r, stream, tp, link, rates);
    blocks.forward += b.forward;
    blocks.backward += b.backward;
    blocks.hidden_backward += b.hidden_backward;
  };
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) add_block(l, entry_recipe(policy, l, layers));
  }
  // The depths' blocks (under the last layer's recipe).
  const int depths = stage.head_rows > 0 ? config.model.mtp_depths : 0;
  for (int l = layers; l < layers + depths; ++l) add_block(l, entry_recipe(policy, l, layers));
  TpSeconds t = blocks;
  if (config.model.recompute) t.backward += blocks.forward;
  const int lookups = (stage.chunks.front().first == 0 ? 1 : 0) + depths;
  const int heads = (stage.head_rows > 0 ? 1 : 0) + depths;
  t.forward += lookups * (sp ? gather : reduce) + heads * (sp ? gather : 0.0);
  t.backward += lookups * (sp ? gather : 0.0) + heads * (sp ? gather : reduce);
  if (sp) {
    t.forward += depths * all_gather_seconds(2.0 * bytes, tp, link);
    t.backward += depths * gather;
  }
  for (const int64_t n : stage.tp_gradient_sums) t.backward += all_reduce_seconds(kCommBytes * n, tp, link);
  return t;
}

// Seconds of one micro-batch's all-to-all over `ranks` of `bytes` per rank: each sends (n - 1)/n
// of them, one latency per peer.
double all_to_all_seconds(double bytes, int ranks, const Link& link) {
  if (ranks <= 1) return 0.0;
  return (ranks - 1) * link.latency + static_cast<double>(ranks - 1) / ranks * bytes / link.bandwidth;
}

// Forward and backward seconds of expert parallelism's token exchanges for one micro-batch of
// `tokens` this rank dispatches (parallel/expert/): each MoE layer's routed rows (top_k rows a
// token, fp32 at the experts' width) to the experts' ranks
// and back, forward and backward, (ep - 1)/ep of them crossing when the routing is balanced; not
// hidden. The multi-token prediction depths' MoE blocks too, on the rank holding the head.
double expert_parallel_seconds(const config::RunConfig& config, const StageMemory& stage, double tokens, int ep,
                               const Link& link) {
  const double width = config.model.moe.latent_size > 0 ? config.model.moe.latent_size : config.model.d_model;
  const double one = all_to_all_seconds(tokens * config.model.moe.top_k * width * kCommBytes, ep, link);
  auto moe = [&](int l) { return stage.widths[static_cast<size_t>(l)].has_moe() ? 1 : 0; };
  int moe_layers = 0;
  for (const model::LayerRange& c : stage.chunks) {
    for (int l = c.first; l < c.last; ++l) moe_layers += moe(l);
  }
  const int layers = config.model.layers, depths = stage.head_rows > 0 ? config.model.mtp_depths : 0;
  for (int l = layers; l < layers + depths; ++l) moe_layers += moe(l);
  return 4.0 * moe_layers * one;
}

}  // namespace loom::plan
