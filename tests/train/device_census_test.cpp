// What one training step asks of the device: kernel launches and copies, and the transfers
// between host and device. A read back (to_host, an entry returning a value) waits for the
// device's queued work on a GPU; an upload (from_host) of a step's small inputs does not (pinned
// staging, kernels/cuda/upload_staging.h). A step that waits on the device lets the GPU run dry
// while the host queues the next work, so the waits and uploads are counted here, on the emulated
// device, for the ~1B config's layer count (configs/llama-1b.yaml: 16 blocks) at tiny widths, and
// held to what each one is for.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "device_training.h"

namespace loom::train {
namespace {

using ::loom::testing::EmulatedCensus;
using ::loom::testing::emulated_census;
using ::loom::testing::reset_emulated_census;

// The ~1B config's shape at tiny widths: 16 Llama-style blocks (tied embeddings, RoPE, GQA).
constexpr const char* kDeep =
    "model: {vocab_size: 0, d_model: 32, layers: 16, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n";

// The entries that return a value to the host (each a wait for the device on a GPU).
constexpr const char* kValueEntries[] = {"softmax_cross_entropy", "softmax_cross_entropy_bf16", "sum_of_squares",
                                         "amax"};

// One step's waits for the device, and its launches.
struct StepCensus {
  int64_t launches = 0, to_host = 0, from_host = 0, copies = 0, zeroes = 0;
  std::map<std::string, int64_t> entries;
  int64_t entry(const std::string& op) const {
    const auto it = entries.find(op);
    return it == entries.end() ? 0 : it->second;
  }
  int64_t waits() const {
    int64_t n = to_host;
    for (const char* op : kValueEntries) n += entry(op);
    return n;
  }
};

}  // namespace

class DeviceCensus : public DeviceTraining {
 protected:
  // One step's census on the device: a run of 3 steps less a run of 2 (the setup, the final
  // checkpoint and the metrics cancel), printed.
  StepCensus one_step(const std::string& tag, const char* model, std::vector<std::string> overrides) {
    overrides.push_back("runtime.device=cuda");
    auto run = [&](int steps) {
      reset_emulated_census();
      train(tag + "-" + std::to_string(steps), model, overrides, steps);
      return emulated_census();
    };
    const EmulatedCensus two = run(2), three = run(3);
    StepCensus step{three.launches() - two.launches(), three.to_host - two.to_host, three.from_host - two.from_host,
                    three.copies - two.copies, three.zeroes - two.zeroes, {}};
    for (const auto& [op, calls] : three.entries) {
      const auto before = two.entries.find(op);
      const int64_t per_step = calls - (before == two.entries.end() ? 0 : before->second);
      if (per_step != 0) step.entries[op] = per_step;
    }
    std::printf("[census] %s, per step: %lld launches (%lld copies, %lld zeroings), %lld waits for the device "
                "(%lld to_host), %lld uploads\n",
                tag.c_str(), static_cast<long long>(step.launches), static_cast<long long>(step.copies),
                static_cast<long long>(step.zeroes), static_cast<long long>(step.waits()),
                static_cast<long long>(step.to_host), static_cast<long long>(step.from_host));
    return step;
  }
};

// 2 micro-batches per step (the fixture's global batch 4 of micro-batches of 2). Each micro-batch
// uploads its tokens for the embedding's forward and again for its backward (a pipeline may run
// other micro-batches' forwards in between) and its targets (learned positions: their ids twice
// more), none of which waits, and reads its loss back; each step reads the gradient norm (also
// the check for Inf/NaN). Nothing else waits: no layer reads the device (fp8_current's scales and
// amaxes stay there), fp8_delayed reads its amaxes once per step.
TEST_F(DeviceCensus, AStepOfTheDeepModelWaitsForTheDeviceOnlyForItsInputsLossAndNorms) {
  constexpr int64_t kMicroBatches = 2;
  for (const char* recipe : {"bf16", "fp8_current", "fp8_delayed", "mxfp8"}) {
    const StepCensus step = one_step(recipe, kDeep, {std::string("precision.recipe=") + recipe});
    const int64_t amax_reads = std::string(recipe) == "fp8_delayed" ? 1 : 0;
    EXPECT_EQ(step.to_host, amax_reads) << recipe;
    EXPECT_EQ(step.from_host, 3 * kMicroBatches) << recipe;
    // Each recipe's head is bf16: its logits stay bf16 into the loss (Transformer::bf16_logits).
    EXPECT_EQ(step.entry("softmax_cross_entropy_bf16"), kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("softmax_cross_entropy"), 0) << recipe;
    // The gradient norm is also the check for Inf or NaN: one read of the gradients, one wait.
    EXPECT_EQ(step.entry("sum_of_squares"), 1) << recipe;
    // The update in one multi-tensor call, decayed weights and undecayed norms alike (each tensor
    // names its step).
    EXPECT_EQ(step.entry("adamw_update_many"), 1) << recipe;
    EXPECT_EQ(step.waits(), kMicroBatches + 1 + amax_reads) << recipe;
    // No block copies the residual stream: each output projection's add writes the stream's next
    // tensor from its input (Block::forward's residual_in).
    EXPECT_EQ(step.copies, 0) << recipe;
    // Every block's norms read their output gradients in bf16 (the q/k/v and up projections' dgrad
    // leaves them so: ColumnParallelLinear::gives_bf16_input_grad); the final norm's is fp32.
    EXPECT_EQ(step.entry("rmsnorm_backward_bf16"), 2 * 16 * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("rmsnorm_backward"), kMicroBatches) << recipe;
    // Every linear layer's three GEMMs (forward, dgrad, wgrad) per micro-batch: 16 blocks of 4, and the head.
    EXPECT_EQ(step.entry("precision_linear_gemm"), (16 * 4 + 1) * 3 * kMicroBatches) << recipe;
    // The blocks' wgrads write their gradients whole in the first micro-batch (zero_grads left them
    // stale: model/parameters.h) and add into them in the second; the head's (the tied embedding's
    // gradient) adds. The rest of the gradient buffer is zeroed in one call after the update, and
    // nothing else zeroes a gradient.
    EXPECT_EQ(step.entry("precision_linear_gemm: wgrad written whole"), 16 * 4) << recipe;
    EXPECT_EQ(step.entry("zero_runs"), 1) << recipe;
    // No bf16 dgrad casts its output gradient: the q/k/v and up projections' come bf16 from attention
    // and the activation, the head's is the loss's bf16 gradient, and the output projections' (the
    // residual stream's gradient) the norm that last updated it wrote in bf16 too (ResidualGradForReader):
    // the bf16 blocks' under every recipe, the FP8 blocks' being FP8 codes.
    EXPECT_EQ(step.entry("precision_linear_gemm: dgrad casting dout to bf16"), 0) << recipe;
    // Per-tensor FP8's amaxes, in the 14 FP8 blocks' 56 linears (the edge blocks are bf16): the
    // input (its codes kept from the forward for wgrad) and the output gradient once per
    // micro-batch, the weight once per step (the weight cast cache; both forms from one read); the
    // output projection's input is attention's bf16 output (Attention::bf16_tensors); the down
    // projection's input and the up projection's output gradient have theirs taken by the
    // activation's kernels (DeviceTensors' in_amax, dout_amax), the q/k/v and up projections'
    // inputs by the norms' statistics passes (Norm::forward_codes), the output and down
    // projections' output gradients (the residual stream's gradient) by the norm backwards that
    // last updated them (ResidualGradForReader; the final norm's and the bf16 last block's first
    // norm's for the FP8 blocks' down projections too), the q/k/v projection's by attention's
    // backward as it writes it: no pass but the output projection's input's, in bf16 (cuDNN's
    // output). The weights' amaxes are the optimizer's (its pass takes each FP8 weight's:
    // model/optimizer_weight_casts.h): no pass over a weight. fp8_delayed's casts take theirs as
    // they read (its scales are known before): no pass at all, but the weights' codes are the
    // optimizer's too, and each weight's amax goes from the optimizer's float to the history's
    // pending one (a 1-element amax_into per weight and step).
    const bool delayed = std::string(recipe) == "fp8_delayed";
    const bool per_tensor = std::string(recipe) == "fp8_current" || delayed;
    const bool amax_passes = per_tensor && !delayed;
    EXPECT_EQ(step.entry("amax_into"), delayed ? 56 : 0) << recipe;
    EXPECT_EQ(step.entry("amax_into_bf16"), amax_passes ? 14 * kMicroBatches : 0) << recipe;
    // Zeroings: the head's input gradient (the final norm's backward adds into it) once per
    // micro-batch. Per-tensor FP8 adds one for the optimizer's slab of FP8 weight amaxes
    // (model/optimizer_weight_casts.h); fp8_current's 224 operand amaxes a step take their floats
    // from AmaxSlots, which zeroes a half of its ring of 2 x 256 at a time (one launch at most
    // each step); fp8_delayed clears every layer's pending amaxes in one zeroing at the step's
    // start and one at its commit. mxfp8's 14 FP8 blocks zero their fp32 q/k/v gradients for
    // attention's backward to add into, once per micro-batch.
    const bool mx = std::string(recipe) == "mxfp8";
    const int64_t other_zeroes = delayed ? 1 + 2 : amax_passes ? 1 + 1 : mx ? 14 * kMicroBatches : 0;
    if (amax_passes) {
      EXPECT_LE(step.zeroes, kMicroBatches + other_zeroes) << recipe;
    } else {
      EXPECT_EQ(step.zeroes, kMicroBatches + other_zeroes) << recipe;
    }
    // Attention keeps its tensors bf16 under bf16 and per-tensor FP8 (MXFP8: its two bf16 edge blocks).
    const int64_t bf16_attention = per_tensor || std::string(recipe) == "bf16" ? 16 : 2;
    EXPECT_EQ(step.entry("flash_attention_forward_bf16_tensors"), bf16_attention * kMicroBatches) << recipe;
    // The bf16 blocks (all under bf16, the two edge blocks otherwise) keep the q/k/v gradient bf16
    // as well (Attention::bf16_gradients); the others' backward writes it whole in fp32 with RoPE
    // undone (no zeroing, no rotation pass).
    const int64_t bf16_gradients = std::string(recipe) == "bf16" ? 16 : 2;
    EXPECT_EQ(step.entry("flash_attention_backward_fp32_gradients"), (bf16_attention - bf16_gradients) * kMicroBatches)
        << recipe;
    EXPECT_EQ(step.entry("flash_attention_backward_bf16_tensors"), 0) << recipe;
    EXPECT_EQ(step.entry("rope_backward"), (16 - bf16_attention) * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("flash_attention_backward_bf16_gradients"), bf16_gradients * kMicroBatches) << recipe;
    // Every block's MLP keeps its hidden bf16 (Mlp::bf16_interior under bf16, bf16_hidden under
    // FP8 and MX): the activation reads it as it is, forward and backward.
    const int64_t activation_passes = delayed ? 2 : 16;
    EXPECT_EQ(step.entry("activation_forward_bf16"), activation_passes * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("activation_backward_bf16"), activation_passes * kMicroBatches) << recipe;
    // Under fp8_current 14 of those are the FP8 blocks' amax passes, after which the activation's
    // kernels write the down projection's input codes and the up projection's output-gradient
    // codes themselves (Mlp::fp8_codes_from_activation): no fp32 activation or hidden gradient.
    // fp8_delayed's codes passes take the amaxes themselves: only the bf16 edge blocks' remain.
    EXPECT_EQ(step.entry("activation_forward_codes"), per_tensor ? 14 * kMicroBatches : 0) << recipe;
    EXPECT_EQ(step.entry("activation_backward_codes"), per_tensor ? 14 * kMicroBatches : 0) << recipe;
    EXPECT_EQ(step.entry("swiglu_forward") + step.entry("swiglu_backward"), 0) << recipe;
    // The bf16 blocks' norms before attention and the MLP write bf16 (the FP8 recipes' two edge
    // blocks are bf16), adding the product before them into the stream as they read it
    // (Norm::forward_added): the MLP's norm attention's, a block's first norm the block before's
    // MLP's (ResidualLink; all but the first block's). Under per-tensor FP8 the other blocks' norms
    // write their projections' FP8 codes (statistics, then codes: no output); the final norm stays
    // fp32.
    const int64_t bf16_blocks = std::string(recipe) == "bf16" ? 16 : 2;
    const int64_t codes_norms = per_tensor ? 2 * (16 - bf16_blocks) : 0;
    EXPECT_EQ(step.entry("rmsnorm_forward_bf16"), kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("rmsnorm_add_forward_bf16"), (2 * bf16_blocks - 1) * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("norm_statistics"), codes_norms * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("norm_forward_codes"), codes_norms * kMicroBatches) << recipe;
    EXPECT_EQ(step.entry("rmsnorm_forward"), (2 * (16 - bf16_blocks) - codes_norms + 1) * kMicroBatches) << recipe;
  }
  const StepCensus gpt2 = one_step("gpt2-bf16", kGpt2, {"precision.recipe=bf16", "model.recompute=true"});
  EXPECT_EQ(gpt2.to_host, 0);
  EXPECT_EQ(gpt2.from_host, 5 * kMicroBatches);
  EXPECT_EQ(gpt2.waits(), kMicroBatches + 1);
  EXPECT_EQ(gpt2.copies, 0);
  EXPECT_EQ(gpt2.zeroes, kMicroBatches);  // the head's input gradient
  EXPECT_EQ(gpt2.entry("layernorm_backward_bf16"), 2 * 2 * kMicroBatches);  // 2 blocks' two norms
  // Each block's second norm adds attention's product in, the second block's first norm the first
  // block's MLP's; a block recomputed before its backward starts from its saved input.
  EXPECT_EQ(gpt2.entry("layernorm_add_forward_bf16"), (3 + 2) * kMicroBatches);
  EXPECT_EQ(gpt2.entry("layernorm_forward_bf16"), (1 + 2) * kMicroBatches);
  EXPECT_EQ(gpt2.entry("precision_linear_gemm: dgrad casting dout to bf16"), 0);  // biases' sums read the fp32 one
  EXPECT_EQ(gpt2.entry("adamw_update_many"), 1);  // biases and norms undecayed, weights decayed: one call
  EXPECT_EQ(gpt2.entry("precision_linear_gemm: wgrad written whole"), 2 * 4);
  // GELU runs in the MLPs' products' epilogues (Mlp::fuses_gelu): no activation pass. The up
  // projections' forwards (again where recomputed) and the down projections' dgrads.
  EXPECT_EQ(gpt2.entry("activation_forward_bf16") + gpt2.entry("activation_backward_bf16"), 0);
  EXPECT_EQ(gpt2.entry("precision_linear_gemm: GELU epilogue"), (2 * 2 + 2) * kMicroBatches);
  EXPECT_EQ(gpt2.entry("zero_runs"), 1);
  // precision.gelu_epilogue = false: the activation's passes again, forward (again where
  // recomputed) and backward, and no epilogue.
  const StepCensus passes =
      one_step("gpt2-gelu-passes", kGpt2,
               {"precision.recipe=bf16", "model.recompute=true", "precision.gelu_epilogue=false"});
  EXPECT_EQ(passes.entry("precision_linear_gemm: GELU epilogue"), 0);
  EXPECT_EQ(passes.entry("activation_forward_bf16"), (2 + 2) * kMicroBatches);
  EXPECT_EQ(passes.entry("activation_backward_bf16"), 2 * kMicroBatches);
}

// A latent MoE layer after a dense block (4 experts, top-2, the balancing and z losses, a shared
// expert with its sigmoid gate).
constexpr const char* kMoeCensus =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true,\n"
    "        block_configs: [{ffn: dense}, {ffn: moe}], moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16,\n"
    "        moe_latent_size: 16, moe_aux_loss_coeff: 0.01, moe_z_loss_coeff: 0.001,\n"
    "        moe_shared_ffn_size: 16, moe_shared_expert_gate: true}\n";

// A MoE layer's routing decisions are the host's: its forward reads back the selections, combine
// weights and the losses' sums the router's kernel computed from the logits where they are
// (kernels::moe_router_forward: one wait per layer and micro-batch, where Megatron's dispatcher
// reads its token counts), and uploads what the dispatch and the router's backward read: each
// dispatched row's token and combine weight, each selection's dispatched row, the balancing loss's
// counts and factors. Its backward waits for nothing and uploads nothing: the router's gradient is
// computed where its logits are (kernels::moe_router_backward) from the rows' dot products left
// there. The shared expert's gate and its gradient are computed where the rows are too
// (kernels::sigmoid_gate, sigmoid_gate_backward).
TEST_F(DeviceCensus, AMoeLayerWaitsForTheDeviceOnceInItsForwardAndNeverInItsBackward) {
  constexpr int64_t kMicroBatches = 2;
  const StepCensus step = one_step("moe-bf16", kMoeCensus, {"precision.recipe=bf16"});
  EXPECT_EQ(step.to_host, kMicroBatches);  // the selections
  EXPECT_EQ(step.waits(), kMicroBatches + kMicroBatches + 1);  // and the losses and the norm
  EXPECT_EQ(step.from_host, (3 + 5) * kMicroBatches);  // the tokens (twice) and targets, and the layer's 5
  EXPECT_EQ(step.entry("moe_router_forward"), kMicroBatches);
  EXPECT_EQ(step.entry("moe_router_backward"), kMicroBatches);
  EXPECT_EQ(step.entry("sigmoid_gate"), kMicroBatches);
  EXPECT_EQ(step.entry("sigmoid_gate_backward"), kMicroBatches);
  EXPECT_EQ(step.entry("row_dots"), 3 * kMicroBatches);  // the gate's logits and gradient, the combine weights
}

}  // namespace loom::train
