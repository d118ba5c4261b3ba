// Mixture-of-experts layers with runtime.device=cuda on the emulated device: the router's
// logits come to the host for the routing decisions, the rows move by the device's gathers and
// scatter-adds (kernels/ops.h), and every run equals the same run on the CPU bit for bit (losses
// and every tensor of the final checkpoint): one rank with and without recompute, GELU experts,
// latent experts, the aux-loss-free expert bias, data x expert parallelism (the all-to-all and
// the global loss's sums staged through the host), with ZeRO-3, pipelines, tensor x sequence
// parallelism, and experts folded onto the tensor-parallel ranks. That the
// CPU layouts train as one rank does is tested in expert_parallel_test.cpp.
#include "device_training.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

// A dense layer and an MoE layer: 4 experts (SwiGLU), top-2, a shared expert with its sigmoid
// gate, the load-balancing and z losses.
constexpr const char* kMoe =
    "model: {vocab_size: 0, d_model: 16, layers: 2, heads: 2, ffn_size: 32, max_seq_len: 32,\n"
    "        tied_embeddings: false, block_configs: [{ffn: dense}, {ffn: moe}],\n"
    "        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16, moe_shared_ffn_size: 8,\n"
    "        moe_shared_expert_gate: true, moe_aux_loss_coeff: 0.01, moe_z_loss_coeff: 0.001}\n";

TEST_F(DeviceLayouts, MoeOnOneRankEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe");
  // The routed experts' GEMMs through the device's precision GEMM: bf16, and (their layer the
  // last block, which keeps bf16 unless told) FP8, each expert's rows padded to the 16 rows a
  // GPU's FP8 product takes (the shared expert as wide as FP8's products take).
  expect_bitwise_equal_runs(kMoe, "moe-bf16", {"precision.recipe=bf16"});
  expect_bitwise_equal_runs(kMoe, "moe-fp8-current", {"precision.recipe=fp8_current"});
  // mxfp8: the experts' bf16 hidden rows unpadded (ExpertMlp::bf16_hidden at any row offset).
  for (const std::string recipe : {"fp8_current", "fp8_delayed", "mxfp8"}) {
    expect_bitwise_equal_runs(kMoe, "moe-fp8-experts-" + recipe,
                              {"precision.recipe=" + recipe, "precision.fp8_edge_layers_bf16=false",
                               "model.moe_shared_ffn_size=16"});
  }
  expect_bitwise_equal_runs(kMoe, "moe-recompute", {"model.recompute=true"});
  expect_bitwise_equal_runs(kMoe, "moe-gelu-softmax-topk", {"model.activation=gelu", "model.moe_router=softmax_topk"});
}

TEST_F(DeviceLayouts, LatentMoeWithCapacityEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-latent",
                            {"model.moe_latent_size=8", "model.moe_capacity_factor=1.0",
                             "model.moe_drop_policy=probs"});
}

TEST_F(DeviceLayouts, MoeWithTheExpertBiasEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-bias",
                            {"model.moe_router=sigmoid", "model.moe_expert_bias=true",
                             "model.moe_bias_update_rate=0.01", "model.moe_aux_loss=sequence"});
}

TEST_F(DeviceLayouts, DataAndExpertParallelMoeEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-dp2-ep2", {"runtime.ranks=2", "parallel.ep=2", "train.micro_batch=1"});
  // The global balancing loss sums the selection counts over the routing ranks (host arrays).
  expect_bitwise_equal_runs(kMoe, "moe-dp2-ep2-global",
                            {"runtime.ranks=2", "parallel.ep=2", "train.micro_batch=1", "model.moe_aux_loss=global"});
}

// ZeRO-3 shards the dense and the expert parameters over their own groups.
TEST_F(DeviceLayouts, ExpertParallelMoeWithZero3EqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-dp2-ep2-zero3",
                            {"runtime.ranks=2", "parallel.ep=2", "train.micro_batch=1", "parallel.zero=3"});
}

TEST_F(DeviceLayouts, PipelinedMoeEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-pp2", {"runtime.ranks=2", "parallel.pp=2"});
}

TEST_F(DeviceLayouts, TensorAndSequenceParallelMoeEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-tp2-sp",
                            {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"});
}

// MoE parallel folding: the experts split over the tensor-parallel ranks, each running its share
// of the tokens; without sequence parallelism the shares' outputs are summed over tp.
TEST_F(DeviceLayouts, ExpertsFoldedOntoTheTensorParallelRanksEqualTheCpuBitForBit) {
  expect_bitwise_equal_runs(kMoe, "moe-tp2-ep2", {"runtime.ranks=2", "parallel.tp=2", "parallel.ep=2"});
  expect_bitwise_equal_runs(kMoe, "moe-tp2-sp-ep2",
                            {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true", "parallel.ep=2"});
}

TEST_F(DeviceLayouts, MoeCheckpointsMoveBetweenDeviceAndCpu) {
  expect_checkpoints_move_between_devices(kMoe, "moe-");
}

}  // namespace
}  // namespace loom::train
