#pragma once
// Activation memory of one rank for one micro-batch of `batch` x `seq` tokens, as loom's modules
// size their buffers (model/block.h Saved, model/transformer.h Activations; fp32 on the CPU
// backend, `element_bytes` each), from the rank's layer widths (layer_widths.h):
//
//   per layer held     residual stream rows x d_model, and unless recomputed the block's saved
//                      tensors: norm outputs (normed_bytes) and statistics, q/k/v, the tiled attention's
//                      log-sum-exp per query and head, attention output, the MLP's hidden and
//                      activation (a kernel that keeps its probabilities adds batch x heads x seq^2),
//                      on a GPU under per-tensor FP8 the linears' input codes; a Mamba-2 mixer's
//                      projections, convolution, scan output, gated norm and its statistics; a MoE
//                      layer's router logits, dispatched, returned and combined rows, its experts'
//                      hidden and activation, latent and shared-expert tensors
//   head (last stage)  final norm, logits (rows x vocabulary shard, logit_bytes each), its input
//                      under sequence parallelism; per multi-token prediction depth its norms,
//                      combined rows, block and the head's the same again
//   workspace          what backward reuses across layers (the widest layer's gradients), the
//                      one recompute buffer set, tensor-parallel gather/partial buffers, the
//                      context-parallel attention's exchange buffers, the precision recipe's
//                      quantized operand copies, the loss rows, the Mamba-2 mixers' gradients,
//                      the MoE layers' shared scratch (model::MoeScratch), multi-token prediction's
//                      gradients; on a device the weight cast cache (weight_cast_cache_bytes)
//                      and the widest Mamba-2 mixer's scan work arrays (one backward call's)
#include <cstdint>
#include <vector>

#include "loom/config/run_config.h"
#include "loom/model/transformer.h"
#include "loom/plan/layer_widths.h"

namespace loom::plan {

struct ActivationShape {
  int64_t batch = 1, seq = 1;
  int tp = 1;
  bool sequence_parallel = false;
  int64_t element_bytes = 4;
  bool attention_probs = false;  // true: a kernel that keeps them (loom's is tiled: it does not)
  // The logits' bytes: element_bytes, or 2 where a GPU keeps them bf16 (Transformer::bf16_logits).
  int64_t logit_bytes = 4;
  // The MLP's saved hidden and activation: element_bytes, or 2 where a GPU keeps them bf16
  // (Mlp::bf16_interior: every block under the bf16 recipe); the hidden also under the FP8 and MX
  // recipes (Mlp::bf16_hidden); no activation (0) where its FP8 codes are all that is kept
  // (Mlp::fp8_codes_from_activation).
  int64_t mlp_bytes = 4;
  int64_t mlp_hidden_bytes = 4;
  // The routed experts' saved hidden and activation: element_bytes, or 2 where a GPU keeps them
  // bf16 (ExpertMlp's bf16 interior: under the bf16 recipe, which also casts the experts' input and
  // output gradient into a bf16 copy of each in ExpertScratch); the hidden also under the FP8 and
  // MX recipes (ExpertMlp's bf16 hidden).
  int64_t expert_bytes = 4;
  int64_t expert_hidden_bytes = 4;
  // The q/k/v and attention output saved for backward: element_bytes, or 2 where a GPU keeps them
  // bf16 (Attention::bf16_tensors: every block under the bf16 recipe and per-tensor FP8).
  int64_t attention_bytes = 4;
  // The outputs of the norms before attention and a dense MLP: element_bytes, or 2 where a GPU
  // hands them to bf16 projections in bf16 (Norm::forward's bf16 output: every block under the
  // bf16 recipe), or 0 where it writes FP8 codes instead (Norm::forward_codes, the codes counted
  // in input_code_bytes). Their statistics stay element_bytes.
  int64_t normed_bytes = 4;
  // Bytes per element of each linear's input kept as FP8 codes for its weight gradient: 1 where a
  // GPU keeps them (fp8_input_codes_on_device), else 0.
  int64_t input_code_bytes = 0;
  // Context parallelism (parallel.cp): `seq` is then this rank's share of each sequence (seq_len /
  // cp), and attention spans the group through a ring of key/value blocks (p2p) or an all-to-all
  // to whole heads (a2a: cp_all_to_all), which also keeps its heads' gathered q/k/v and output
  // over the whole sequence for backward (model::ContextSaved), as large as the rank's own.
  int cp = 1;
  bool cp_all_to_all = false;
  // Expert parallelism (parallel.ep): a MoE layer's experts are spread over `ep` ranks, which
  // exchange the routed rows. Planned at balanced routing: each rank's experts then receive as
  // many rows as the rank routes (routed_rows).
  int ep = 1;
  int64_t rows() const { return batch * seq; }
  int64_t local_rows() const { return sequence_parallel && tp > 1 ? rows() / tp : rows(); }
};

// Whether the model keeps the head's logits in bf16 (Transformer::bf16_logits): on a GPU
// (runtime.device: cuda) under a bf16 head (the bf16, FP8 and MX recipes) with the whole
// vocabulary on the rank (tp 1). A GRPO learner's token objective keeps them fp32.
bool bf16_logits_on_device(const config::RunConfig& config, int tp);
// Whether every block's MLP keeps its interior bf16 (Mlp::bf16_interior): on a GPU under the bf16
// recipe (an FP8 recipe's bf16 edge blocks do too; not counted).
bool bf16_mlp_on_device(const config::RunConfig& config);
// Whether every block's MLP keeps its hidden pre-activation bf16 (Mlp::bf16_interior or
// bf16_hidden), and the routed experts theirs (ExpertMlp's likewise): on a GPU under any recipe
// but fp32 and fp16.
bool bf16_mlp_hidden_on_device(const config::RunConfig& config);
// Whether every block's norms before attention and a dense MLP write their outputs in bf16 for the
// projections after them (Attention / Mlp::takes_bf16_input): on a GPU under the bf16 recipe.
bool bf16_normed_on_device(const config::RunConfig& config);
// Whether every block's attention keeps q/k/v and its output bf16 (Attention::bf16_tensors): on a GPU under
// the bf16 recipe or per-tensor FP8 with bf16 attention operands (precision.attention auto or bf16)
// and no context parallelism.
bool bf16_attention_on_device(const config::RunConfig& config);
// Whether every block's linears keep their inputs' FP8 codes for the weight gradient
// (LinearPrecision::keeps_input_codes): on a GPU under fp8_delayed or fp8_current (counted for
// every block, though the bf16 edge blocks keep none).
bool fp8_input_codes_on_device(const config::RunConfig& config);
// Whether, within that, every block's MLP has its activation's kernels write the projections' FP8
// codes themselves and keeps no activation (Mlp::fp8_codes_from_activation): without biases.
bool fp8_mlp_codes_on_device(const config::RunConfig& config);
// Whether, within that, every block's norms before attention and a dense MLP write the q/k/v and
// up projections' FP8 codes themselves and keep no output (Norm::forward_codes): without sequence
// parallelism over a tensor-parallel group of `tp`.
bool fp8_normed_codes_on_device(const config::RunConfig& config, int tp);

// The rows a MoE layer dispatches for a routing group of `tokens` (one rank's micro-batch): top_k
// per token, or at most each expert's capacity (model.moe_capacity_factor) when that is fewer; 0
// for a layer without experts.
int64_t routed_rows(const config::ModelConfig& model, const LayerWidths& w, int64_t tokens);

// What one block keeps from its forward for its backward, by the Block::Saved member holding it
// (under recompute one Block::Saved serves every layer, each member as large as its largest use).
struct BlockSavedParts {
  int64_t norm1 = 0, mid = 0, attention = 0, mamba = 0, norm2 = 0, mlp = 0, moe = 0;
};
BlockSavedParts block_saved_parts(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a);

// Bytes one block keeps from its forward for its backward.
int64_t block_saved_bytes(const config::ModelConfig& model, const LayerWidths& w, const ActivationShape& a);

// One micro-batch's activations on a rank holding `chunks` (with the head: `head_rows` > 0).
int64_t micro_batch_activation_bytes(const config::ModelConfig& model, const std::vector<LayerWidths>& widths,
                                     const std::vector<model::LayerRange>& chunks, int64_t head_rows,
                                     const ActivationShape& a);

// Under context parallelism (a.cp > 1) the exchange buffers of the model's one ContextAttention
// (parallel/context/: ring_attention.h, ulysses_attention.h), sized by its widest layer; else 0.
int64_t context_attention_bytes(const std::vector<LayerWidths>& widths, const std::vector<model::LayerRange>& chunks,
                                const ActivationShape& a);

// Buffers a rank allocates once and reuses for every layer and micro-batch.
int64_t workspace_bytes(const config::RunConfig& config, const std::vector<LayerWidths>& widths,
                        const std::vector<model::LayerRange>& chunks, int64_t head_rows, const ActivationShape& a);

// Under tensor parallelism, the buffers summing the gradients of parameters every rank holds whole
// but computes in part (model::TensorParallelGrads: under sequence parallelism the replicated norms,
// MoE routers, latent projections and experts; kv heads replicated over ranks): a unit's (one
// layer's) gradients set aside and their global tensors, each as large as the largest unit's.
int64_t tensor_parallel_gradient_sum_bytes(const std::vector<model::Parameter>& params, int layers, int tp);
// The fp32 all-reduces those sums make after each unit's backward, per micro-batch: each unit's
// global elements (units with none left out; none with one rank).
std::vector<int64_t> tensor_parallel_gradient_sums(const std::vector<model::Parameter>& params, int layers, int tp);

// On a device (runtime.device=cuda) under a precision recipe, the weights' casts a training step
// keeps while its micro-batches run (model/weight_cast_cache.h): per element of each linear
// layer's weight 2 bytes (a bf16 / fp16 copy, or FP8 codes for forward and transposed ones for
// dgrad), 4 under mxfp8 (two decoded bf16 forms), and 2 per element of the head (`head_rows`) and
// of the routed experts' weights (16-bit under every recipe); none of the bf16 ones where the
// optimizer's bf16 copy of the parameters serves them
// (parallel::keeps_bf16_parameter_copy, counted with the parameters instead).
int64_t weight_cast_cache_bytes(const config::RunConfig& config, const std::vector<model::Parameter>& params,
                                int64_t head_rows);

}  // namespace loom::plan
