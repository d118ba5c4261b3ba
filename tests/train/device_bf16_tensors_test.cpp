// Training on the emulated CUDA device with the tensors a GPU keeps in bf16 under the bf16 recipe
// (LinearPrecision's DeviceTensors): the head's logits into the bf16 cross-entropy and its gradient
// back (Transformer::bf16_logits), the MLP's interior (Mlp::bf16_interior: the up projection's
// output, the activation, and their gradients), attention's q/k/v, output and output gradient
// (Attention::bf16_tensors), and the outputs of the norms before attention and the MLP
// (Norm::forward's bf16 output; gathered in bf16 under sequence parallelism). Each holds exactly
// what the fp32 path rounds or casts to bf16, so every run equals the same run on the CPU bit for
// bit: Llama (SwiGLU, no biases), GPT-2 (GELU, biases: the up projection's bias gradient summed by
// the activation's backward from the fp32 hidden gradient it leaves in bf16), squared ReLU, with
// recompute, tensor parallelism (the head then vocabulary-parallel in fp32) and a pipeline; and
// each step's entries show the hand-overs (the bf16 loss, norms and activations, no fp32
// cross-entropy, no fp32 activation).
#include "device_training.h"
#include "support/emulated_precision.h"

namespace loom::train {
namespace {

using DeviceBf16Tensors = DeviceTraining;

// How often `op` ran in `census`.
int64_t entry_calls(const ::loom::testing::EmulatedCensus& census, const std::string& op) {
  const auto it = census.entries.find(op);
  return it == census.entries.end() ? int64_t{0} : it->second;
}

std::vector<std::string> bf16(std::vector<std::string> more = {}) {
  more.push_back("precision.recipe=bf16");
  return more;
}

TEST_F(DeviceBf16Tensors, LlamaWithItsMlpInteriorAndLogitsInBf16EqualsTheCpuBitForBit) {
  ::loom::testing::reset_emulated_census();
  expect_bitwise_equal_runs(kLlama, "bf16-llama", bf16());
  const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
  auto calls = [&](const std::string& op) { return entry_calls(census, op); };
  EXPECT_GT(calls("softmax_cross_entropy_bf16"), 0);
  EXPECT_EQ(calls("softmax_cross_entropy"), 0);
  EXPECT_GT(calls("activation_forward_bf16"), 0);
  EXPECT_GT(calls("activation_backward_bf16"), 0);
  EXPECT_EQ(calls("swiglu_forward"), 0);
  EXPECT_EQ(calls("swiglu_backward"), 0);
  // Attention's q/k/v, output and output gradient in bf16 (Attention::bf16_tensors), RoPE on the
  // bf16 q/k/v: 2 blocks x 2 micro-batches x 4 steps, plus the forwards of the run's evaluations.
  // The q/k/v gradient in bf16 too (Attention::bf16_gradients: RoPE undone before it is rounded).
  EXPECT_GE(calls("flash_attention_forward_bf16_tensors"), 16);
  EXPECT_EQ(calls("flash_attention_backward_bf16_gradients"), 16);
  EXPECT_EQ(calls("flash_attention_backward_bf16_tensors"), 0);
  EXPECT_EQ(calls("rope_backward"), 0);
  EXPECT_EQ(calls("rope_forward_bf16"), calls("flash_attention_forward_bf16_tensors"));
  EXPECT_EQ(calls("rope_forward"), 0);
  EXPECT_EQ(calls("flash_attention_forward"), 0);
  EXPECT_EQ(calls("flash_attention_backward"), 0);
  // The norms before attention and the MLP write bf16 for the projections after them (the final
  // norm, before the head, stays fp32): two per block forward, none in fp32, each but the first
  // block's first adding the product before it into the stream (Norm::forward_added: attention's,
  // or the block before's MLP's: Block's ResidualLink).
  EXPECT_EQ(calls("rmsnorm_forward_bf16"), calls("flash_attention_forward_bf16_tensors") / 2);
  EXPECT_EQ(calls("rmsnorm_add_forward_bf16"), 3 * calls("flash_attention_forward_bf16_tensors") / 2);
  EXPECT_EQ(calls("rmsnorm_forward"), calls("flash_attention_forward_bf16_tensors") / 2);
  expect_bitwise_equal_runs(kLlama, "bf16-llama-recompute", bf16({"model.recompute=true"}));
}

// Context parallelism keeps attention's tensors fp32 (its ring merges fp32 partial outputs); the
// run still equals the CPU's.
TEST_F(DeviceBf16Tensors, ContextParallelRanksKeepAttentionInFp32AndEqualTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "bf16-cp2", bf16({"runtime.ranks=2", "parallel.cp=2"}));
}

// GPT-2 keeps the q/k/v gradient bf16 too (Attention::bf16_gradients: every attention backward
// writes it in bf16, the q/k/v bias's gradient summed by the same entry); a RoPE model with a q/k/v
// bias (as Qwen2's) keeps it fp32, written whole with RoPE undone by attention's backward.
TEST_F(DeviceBf16Tensors, Gpt2WithBiasesAndSquaredReluEqualTheCpuBitForBit) {
  ::loom::testing::reset_emulated_census();
  expect_bitwise_equal_runs(kGpt2, "bf16-gpt2", bf16());
  const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
  auto calls = [&](const std::string& op) { return entry_calls(census, op); };
  EXPECT_GT(calls("layernorm_forward_bf16"), 0);  // LayerNorm's bf16 form too
  EXPECT_GT(calls("flash_attention_backward_bf16_gradients"), 0);
  EXPECT_EQ(calls("flash_attention_backward_bf16_tensors"), 0);
  EXPECT_GT(calls("precision_linear_gemm: GELU epilogue"), 0);
  // Its GELU in passes of its own (precision.gelu_epilogue = false): the same numbers.
  ::loom::testing::reset_emulated_census();
  expect_bitwise_equal_runs(kGpt2, "bf16-gpt2-gelu-passes", bf16({"precision.gelu_epilogue=false"}));
  EXPECT_EQ(entry_calls(::loom::testing::emulated_census(), "precision_linear_gemm: GELU epilogue"), 0);
  EXPECT_GT(entry_calls(::loom::testing::emulated_census(), "activation_forward_bf16"), 0);
  expect_bitwise_equal_runs(kLlama, "bf16-relu2", bf16({"model.activation=relu2"}));
  ::loom::testing::reset_emulated_census();
  expect_bitwise_equal_runs(kLlama, "bf16-rope-bias", bf16({"model.bias=true"}));
  const ::loom::testing::EmulatedCensus rope_bias = ::loom::testing::emulated_census();
  EXPECT_EQ(rope_bias.entries.count("flash_attention_backward_bf16_gradients"), 0u);
  EXPECT_GT(rope_bias.entries.count("flash_attention_backward_fp32_gradients"), 0u);  // RoPE undone there too
  EXPECT_EQ(rope_bias.entries.count("rope_backward"), 0u);
}

// A latent MoE layer after a dense one: 4 SwiGLU experts in the latent size, top-2.
constexpr const char* kLatentMoe =
    "model: {vocab_size: 0, d_model: 32, layers: 2, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true,\n"
    "        block_configs: [{ffn: dense}, {ffn: moe}], moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16,\n"
    "        moe_latent_size: 16}\n";

// The MoE layer under the bf16 recipe: its routed experts' interior in bf16 (ExpertMlp's
// bf16_interior: the input and the output gradient cast once for all experts, one activation launch
// and one gradient launch per layer for all of them, in bf16), each projection's experts' GEMMs in
// one call, its latent projections through the bf16 GEMMs; only the router stays fp32. Every run
// equals the CPU's bit for bit, also at ep 2.
TEST_F(DeviceBf16Tensors, LatentMoeWithItsExpertsInteriorInBf16EqualsTheCpuBitForBit) {
  ::loom::testing::reset_emulated_census();
  expect_bitwise_equal_runs(kLatentMoe, "bf16-latent-moe", bf16());
  const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
  auto calls = [&](const std::string& op) { return entry_calls(census, op); };
  // Per model forward: two attention forwards, the dense MLP's activation and the experts' one.
  const int64_t forwards = calls("flash_attention_forward_bf16_tensors") / 2;
  const int64_t backwards = calls("flash_attention_backward_bf16_gradients") / 2;
  ASSERT_GT(forwards, 0);
  ASSERT_GT(backwards, 0);
  EXPECT_EQ(calls("activation_forward_bf16"), 2 * forwards);
  EXPECT_EQ(calls("activation_backward_bf16"), 2 * backwards);
  EXPECT_EQ(calls("swiglu_forward"), 0);
  EXPECT_EQ(calls("swiglu_backward"), 0);
  // The experts' input cast once per forward, and once more with the output gradient per backward;
  // the optimizer's bf16 copy of the parameters made whole once (Bf16ParameterCopy); and in the
  // first forward, before that copy serves, each of the 4 experts' two weights cast into the step's
  // cache apart from its GEMM, which stays grouped.
  EXPECT_EQ(calls("narrow_floats"), forwards + 2 * backwards + 1 + 4 * 2);
  // The router's GEMMs alone in fp32: one forward and one backward per MoE layer.
  EXPECT_EQ(calls("linear_forward"), forwards);
  EXPECT_EQ(calls("linear_backward"), backwards);
  // Each projection's experts' GEMMs in one call (a GPU's grouped product: model/gemm_group.h),
  // their dgrads and wgrads together: two calls per forward and two per backward, of groupable GEMMs
  // (bf16 tensors and the weights' ready casts).
  EXPECT_EQ(calls("precision_linear_gemms"), 2 * forwards + 2 * backwards);
  EXPECT_GT(calls("precision_linear_gemms: groupable"), 0);
  expect_bitwise_equal_runs(kLatentMoe, "bf16-latent-moe-ep2",
                            bf16({"runtime.ranks=2", "parallel.ep=2", "train.micro_batch=1"}));
}

TEST_F(DeviceBf16Tensors, TensorParallelAndPipelineRanksEqualTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "bf16-tp2-sp",
                            bf16({"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}));
  expect_bitwise_equal_runs(kGpt2, "bf16-pp2", bf16({"runtime.ranks=2", "parallel.pp=2"}));
  // GPT-2's bf16 q/k/v gradients under tensor parallelism, with and without sequence parallelism.
  expect_bitwise_equal_runs(kGpt2, "bf16-gpt2-tp2", bf16({"runtime.ranks=2", "parallel.tp=2"}));
  expect_bitwise_equal_runs(kGpt2, "bf16-gpt2-tp2-sp",
                            bf16({"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}));
}

}  // namespace
}  // namespace loom::train
