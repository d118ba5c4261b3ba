// Hybrid (Nemotron-H) models with runtime.device=cuda on the emulated device: the Mamba-2 mixers'
// convolution, chunked scan and gated norm run through their device entries (kernels/ops.h)
// beside attention and MLP layers, and every run equals the same run on the CPU bit for bit
// (losses and every tensor of the final checkpoint): one rank with and without recompute, packed
// documents (the scan and the convolution restart at each document), tensor parallelism (the
// mixer's heads and groups split over the ranks), with sequence parallelism, with context
// parallelism (the mixers sharding heads over the cp ranks), in a pipeline, with
// latent MoE layers and multi-token prediction (Nemotron 3 Super's alphabet), and a checkpoint
// moving between the device and the CPU. That the CPU layouts train as one rank does is tested
// in hybrid_training_test.cpp.
#include <string>

#include "device_training.h"
#include "tiny_super_model.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

// Layers M * M -: two Mamba-2 mixers of 4 heads in 2 groups, a chunk of 6 tokens (so the
// 32-token rows span several blocks and end in a partial one).
constexpr const char* kHybrid =
    "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        activation: relu2, tied_embeddings: false, layer_pattern: 'M*M-',\n"
    "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}\n";

// Layers M * M E with latent experts and two MTP depths.
constexpr const char* kSuper =
    "model: {vocab_size: 0, d_model: 32, layers: 4, heads: 4, kv_heads: 2, ffn_size: 48, max_seq_len: 32,\n"
    "        activation: relu2, tied_embeddings: false, layer_pattern: 'M*ME', mtp_depths: 2,\n"
    "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 24, moe_latent_size: 16, moe_shared_ffn_size: 24,\n"
    "        mamba: {state_size: 8, heads: 4, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 6}}\n";

TEST_F(DeviceLayouts, HybridOnOneRankEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kHybrid, "hybrid");
  expect_bitwise_equal_runs(kHybrid, "hybrid-recompute", {"model.recompute=true"});
}

TEST_F(DeviceLayouts, HybridWithPackedDocumentsEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kHybrid, "hybrid-docs",
                            {"data.reset_attention_mask=true", "data.reset_position_ids=true"});
}

TEST_F(DeviceLayouts, TensorParallelHybridEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kHybrid, "hybrid-tp2", {"runtime.ranks=2", "parallel.tp=2"});
  expect_bitwise_equal_runs(kHybrid, "hybrid-tp2-sp-docs",
                            {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                             "data.reset_attention_mask=true"});
}

// Context parallelism: the mixers' head exchange and the whole sequences' document ids reach the
// device kernels; the MTP depths' gathered ids with them.
TEST_F(DeviceLayouts, ContextParallelHybridEqualsTheCpuBitForBit) {
  for (const std::string comm : {"p2p", "a2a"}) {
    expect_bitwise_equal_runs(kHybrid, "hybrid-cp2-" + comm,
                              {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=" + comm});
  }
  expect_bitwise_equal_runs(kHybrid, "hybrid-cp2-docs",
                            {"runtime.ranks=2", "parallel.cp=2", "data.reset_attention_mask=true"});
  expect_bitwise_equal_runs(kSuper, "super-cp2", {"runtime.ranks=2", "parallel.cp=2"});
}

TEST_F(DeviceLayouts, PipelinedHybridEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kHybrid, "hybrid-pp2", {"runtime.ranks=2", "parallel.pp=2"});
}

TEST_F(DeviceLayouts, HybridWithLatentMoeAndMtpEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kSuper, "super");
  expect_bitwise_equal_runs(kSuper, "super-tp2-recompute", {"runtime.ranks=2", "parallel.tp=2", "model.recompute=true"});
}

// The GPU test's hybrid (testing::kTinySuperModel) under the FP8 recipes with every block FP8, on
// the emulated device, which checks each FP8 GEMM's shape as cuBLASLt would: the Mamba-2 mixers',
// attention's, the shared and the routed experts' (their rows padded to 16) products in FP8; and
// at ep 2 under fp8_delayed.
TEST_F(DeviceLayouts, HybridWithFp8ExpertsEqualsTheCpuBitForBit) {
  const std::vector<std::string> fp8 = {"precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false"};
  expect_bitwise_equal_runs(testing::kTinySuperModel, "super-fp8-current", fp8);
  expect_bitwise_equal_runs(testing::kTinySuperModel, "super-fp8-delayed-ep2",
                            {"precision.recipe=fp8_delayed", "precision.fp8_edge_layers_bf16=false",
                             "runtime.ranks=2", "parallel.ep=2"});
  // A mixer whose in_proj is 2 x 32 + 2 x 2 x 8 + 4 = 100 wide cannot run FP8 there: the error
  // names the GEMM, its sizes and the rule.
  try {
    train("hybrid-fp8-unaligned", kHybrid,
          {"precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false", "runtime.device=cuda"});
    ADD_FAILURE() << "an FP8 GEMM 100 features wide ran on the device";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.layers.0.mixer.in_proj has"), std::string::npos) << what;
    EXPECT_NE(what.find("100 output features"), std::string::npos) << what;
    EXPECT_NE(what.find("multiples of 16"), std::string::npos) << what;
  }
}

TEST_F(DeviceLayouts, HybridCheckpointsMoveBetweenDeviceAndCpu) {
  expect_checkpoints_move_between_devices(kHybrid, "hybrid-");
}

}  // namespace
}  // namespace loom::train
