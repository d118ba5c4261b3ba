// Memory categories of `loom plan memory` against numbers worked out by hand, and the published
// per-parameter figures of mixed-precision Adam (Megatron: 18 bytes, 6 + 12/d with the
// distributed optimizer; a 340B model's 6120 GB of state).
#include <gtest/gtest.h>

#include <string>

#include "loom/core/error.h"
#include "loom/model/transformer.h"
#include "loom/parallel/data/bf16_parameter_copy.h"
#include "loom/plan/activation_memory.h"
#include "loom/plan/memory_plan.h"
#include "loom/plan/report.h"
#include "loom/plan/search.h"
#include "loom/plan/shape_group.h"

namespace loom::plan {
namespace {

// configs/tiny.yaml's model: vocabulary 256, d_model 256, 6 layers, 8 heads / 4 kv heads, ffn 704.
config::RunConfig tiny(const std::vector<std::string>& overrides) {
  const std::string yaml = R"(
model: {vocab_size: 256, d_model: 256, layers: 6, heads: 8, kv_heads: 4, ffn_size: 704, max_seq_len: 256}
data: {seq_len: 128}
train: {global_batch: 8, micro_batch: 4}
)";
  return config::parse_config(yaml, "tiny", overrides);
}

// Per layer: q 256x256, k and v 128x256, o 256x256, gate/up/down 704x256, two norms of 256.
constexpr int64_t kLayer = 65536 + 32768 + 32768 + 65536 + 3 * 180224 + 512;
constexpr int64_t kTiny = 256 * 256 + 6 * kLayer + 256;  // embedding (tied), layers, final norm

TEST(MemoryPlan, OneRankFp32StateIsSixteenBytesPerParameter) {
  const MemoryPlan plan = plan_memory(tiny({}), {.tp = 1, .dp = 1, .pp = 1});
  ASSERT_EQ(plan.stages.size(), 1u);
  const StageMemory& s = plan.stages[0];
  EXPECT_EQ(s.parameter_count, kTiny);
  EXPECT_EQ(kTiny, 4492544);  // as `loom train` reports for configs/tiny.yaml
  EXPECT_EQ(s.state.parameters, 4 * kTiny);
  EXPECT_EQ(s.state.gradients, 4 * kTiny);
  EXPECT_EQ(s.state.master_weights, 0);
  EXPECT_EQ(s.state.optimizer_moments, 8 * kTiny);
  EXPECT_EQ(s.state.communication_buffers, 0);
  EXPECT_EQ(s.gather_buffers, 0);
}

TEST(MemoryPlan, ZeroOneShardsMasterAndMoments) {
  const MemoryPlan plan = plan_memory(tiny({"parallel.zero=1"}), {.tp = 1, .dp = 2, .pp = 1});
  const StageMemory& s = plan.stages[0];
  const int64_t shard = (kTiny + 1) / 2;
  EXPECT_EQ(s.state.parameters, 4 * kTiny);
  EXPECT_EQ(s.state.gradients, 4 * kTiny);
  EXPECT_EQ(s.state.master_weights, 4 * shard);  // loom keeps an fp32 master of its shard
  EXPECT_EQ(s.state.optimizer_moments, 8 * shard);
  // Two slots of (dp + 1) shards of the largest bucket, fp32 on the wire. A bucket closes at the
  // first parameter that takes it to 16 MiB (4 Mi floats), so it holds at most one parameter
  // (the largest: the fused gate/up projection, 1408 x 256) more.
  const int64_t largest = 1408 * 256, slot = 2 * 3 * 4 / 2;
  EXPECT_GE(s.state.communication_buffers, slot * 4194304);
  EXPECT_LT(s.state.communication_buffers, slot * (4194304 + largest));
  // Buckets of 1 MiB: each parameter past the size gets one to itself, which sizes the slots.
  const StageMemory small = plan_memory(tiny({"parallel.zero=1", "parallel.bucket_mb=1"}), {.tp = 1, .dp = 2, .pp = 1}).stages[0];
  EXPECT_GE(small.state.communication_buffers, slot * largest);
  EXPECT_LT(small.state.communication_buffers, slot * (262144 + largest));
}

// One data-parallel replica runs the configured stage too (the trainer builds the stage's
// synchronisation whatever the group's size, as its start-up report shows): ZeRO-1 an fp32 master
// of every parameter and its reduce-scatter staging, ZeRO-2 the full gradient buffer in flight
// during backward, ZeRO-3 its gathered units and its staging.
TEST(MemoryPlan, OneReplicaRunsTheConfiguredStage) {
  auto one_rank = [](const std::string& zero) {
    return plan_memory(tiny({"parallel.zero=" + zero}), {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  };
  const StageMemory zero0 = one_rank("0"), zero1 = one_rank("1"), zero2 = one_rank("2"), zero3 = one_rank("3");
  EXPECT_EQ(zero1.state.master_weights, 4 * kTiny);
  EXPECT_EQ(zero1.state.optimizer_moments, 8 * kTiny);
  EXPECT_GT(zero1.state.communication_buffers, 0);
  EXPECT_EQ(zero1.gather_buffers, 0);
  EXPECT_EQ(zero2.gather_buffers, 4 * kTiny);
  EXPECT_EQ(zero3.state.master_weights, 0);
  EXPECT_GT(zero3.state.communication_buffers, 0);
  EXPECT_GT(zero3.gather_buffers, 0);
  for (const StageMemory* s : {&zero1, &zero2, &zero3}) EXPECT_GT(s->total(), zero0.total());
}

TEST(MemoryPlan, MixedPrecisionAdamIsEighteenBytesAndSixPlusTwelveOverD) {
  const std::vector<std::string> bf16 = {"precision.recipe=bf16", "precision.param_dtype=compute"};
  const StageMemory one = plan_memory(tiny(bf16), {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  const parallel::MemoryBytes& a = one.state;
  EXPECT_EQ(a.parameters + a.gradients + a.master_weights + a.optimizer_moments, 18 * kTiny);
  std::vector<std::string> zero1 = bf16;
  zero1.push_back("parallel.zero=1");
  const StageMemory d4 = plan_memory(tiny(zero1), {.tp = 1, .dp = 4, .pp = 1}).stages[0];
  const parallel::MemoryBytes& b = d4.state;
  EXPECT_EQ(b.parameters + b.gradients, 6 * kTiny);
  EXPECT_EQ(b.master_weights + b.optimizer_moments, 12 * ((kTiny + 3) / 4));
}

TEST(MemoryPlan, TensorParallelRanksHoldTheirShards) {
  const StageMemory s = plan_memory(tiny({"parallel.tp=2"}), {.tp = 2, .dp = 1, .pp = 1}).stages[0];
  // Half the heads (4 q, 2 kv), half the ffn features (352), half the vocabulary; norms whole.
  const int64_t layer = 128 * 256 + 2 * 64 * 256 + 256 * 128 + 3 * 352 * 256 + 512;
  EXPECT_EQ(s.parameter_count, 128 * 256 + 6 * layer + 256);
  EXPECT_EQ(s.parameter_count, 2247936);
}

TEST(MemoryPlan, PipelineStagesSplitTheLayersAndHoldActivationsInFlight) {
  const MemoryPlan plan = plan_memory(tiny({"parallel.pp=2", "train.micro_batch=2"}), {.tp = 1, .dp = 1, .pp = 2});
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.stages[0].parameter_count, 256 * 256 + 3 * kLayer);
  EXPECT_EQ(plan.stages[1].parameter_count, 3 * kLayer + 256 + 256 * 256);  // the tied head's copy
  // 1F1B with 4 micro-batches on 2 stages: the first stage holds 2 in flight, the last 1 (and
  // one more set while its gradient is sent back).
  EXPECT_EQ(plan.stages[0].in_flight, 2);
  EXPECT_EQ(plan.stages[1].in_flight, 1);
  EXPECT_EQ(plan.stages[0].activation_sets, 2);
  EXPECT_EQ(plan.stages[1].activation_sets, 2);
  EXPECT_EQ(plan.stages[0].activations, 2 * plan.stages[0].activations_per_micro_batch);
  // GPipe holds every micro-batch.
  const MemoryPlan gpipe = plan_memory(tiny({"parallel.pp=2", "train.micro_batch=2", "parallel.pipeline_schedule=gpipe"}),
                                       {.tp = 1, .dp = 1, .pp = 2});
  EXPECT_EQ(gpipe.stages[0].in_flight, 4);
  EXPECT_EQ(gpipe.stages[0].activations, 4 * gpipe.stages[0].activations_per_micro_batch);
}

// On a device a training step keeps its weights' casts while its micro-batches run
// (model/weight_cast_cache.h): 2 bytes per element of the linear layers' weights and the head (FP8:
// forward and transposed dgrad codes), 4 for the blocks' under mxfp8; none on the CPU or in fp32.
TEST(MemoryPlan, TheWeightCastCacheOnADeviceIsCountedInTheWorkspace) {
  const int64_t linear = 6 * (65536 + 32768 + 32768 + 65536 + 3 * 180224), head = 256 * 256;
  auto stage = [](const std::string& recipe, bool cuda, int zero) {
    std::vector<std::string> o = {"precision.recipe=" + recipe, "parallel.zero=" + std::to_string(zero)};
    if (cuda) o.push_back("runtime.device=cuda");
    return plan_memory(tiny(o), {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  };
  auto workspace = [&](const std::string& recipe, bool cuda, int zero) { return stage(recipe, cuda, zero).workspace; };
  // ZeRO 1: the cache holds every cast.
  EXPECT_EQ(workspace("bf16", true, 1) - workspace("bf16", false, 1), 2 * linear + 2 * head);
  EXPECT_EQ(workspace("fp8_current", true, 1) - workspace("fp8_current", false, 1), 2 * linear + 2 * head);
  EXPECT_EQ(workspace("mxfp8", true, 1) - workspace("mxfp8", false, 1), 4 * linear + 2 * head);
  EXPECT_EQ(workspace("fp32", true, 1), workspace("fp32", false, 1));
  // ZeRO 0: the optimizer's bf16 copy of the parameters (2 bytes each, with the parameters) serves
  // every bf16 cast: none under bf16, the head's under the FP8 and MX recipes.
  EXPECT_EQ(workspace("bf16", true, 0), workspace("bf16", false, 0));
  EXPECT_EQ(workspace("fp8_current", true, 0) - workspace("fp8_current", false, 0), 2 * linear);
  EXPECT_EQ(workspace("mxfp8", true, 0) - workspace("mxfp8", false, 0), 4 * linear);
  for (const std::string recipe : {"bf16", "fp8_current", "mxfp8"}) {
    const StageMemory on = stage(recipe, true, 0), off = stage(recipe, false, 0);
    EXPECT_EQ(on.state.parameters - off.state.parameters, 2 * on.parameter_count) << recipe;
  }
  EXPECT_EQ(stage("fp16", true, 0).state.parameters, stage("fp16", false, 0).state.parameters);
}

// A model small enough to count every activation buffer by hand: batch 2, seq 8, d_model 16,
// 2 heads (head_dim 8) over 1 kv head, ffn 32 (SwiGLU), vocabulary 16, one layer, untied.
constexpr const char* kHandModel = R"(
model: {vocab_size: 16, d_model: 16, layers: 1, heads: 2, kv_heads: 1, ffn_size: 32, tied_embeddings: false}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";

TEST(ActivationMemory, CountsEveryBufferOfALayerAndTheHead) {
  config::RunConfig run = config::parse_config(kHandModel, "hand", {});
  const MemoryPlan plan = plan_memory(run, {.tp = 1, .dp = 1, .pp = 1});
  // rows 16: norm1 16x16 + 16 rstd, mid 256, qkv 16x32, attention output 256, log-sum-exp
  // 2 x 2 x 8, norm2 272, SwiGLU hidden 16x64 and activation 16x32 = 3136 floats.
  const int64_t block = 272 + 256 + 512 + 256 + 32 + 272 + 1024 + 512;
  // d_x 256, the stream before and after the layer 2 x 256, the final norm 272, logits 16x16
  // (floats), and 16 int32 position ids.
  EXPECT_EQ(plan.stages[0].activations_per_micro_batch, (256 + 512 + block + 272 + 256) * 4 + 16 * 4);
  run.model.recompute = true;
  EXPECT_EQ(plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}).stages[0].activations_per_micro_batch,
            (256 + 512 + 272 + 256) * 4 + 16 * 4);
  MemoryOptions probs;  // a kernel that keeps its probabilities: 2 x 2 x 8 x 8 more
  probs.attention_probs = true;
  run.model.recompute = false;
  EXPECT_EQ(plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}, probs).stages[0].activations_per_micro_batch,
            (256 + 512 + block + 256 + 272 + 256) * 4 + 16 * 4);
  // On a GPU under per-tensor FP8 each linear keeps its input's codes for wgrad (1 byte per
  // element: q/k/v's 16 + o_proj's 16 + the up projection's 16 + down's 32 per row), and attention
  // its q/k/v and output in bf16 (2 of 4 bytes of 16 x (32 + 16)), and the MLP no fp32 activation
  // (16 x 32: its kernels write the down projection's codes themselves, no bias; counted at the 2
  // bytes the bf16 edge blocks keep), nor the two norms' fp32 outputs (16 x 16 each: the norms
  // write the q/k/v and up projections' codes themselves; also counted at the edge blocks' 2
  // bytes), which the blockwise recipe does not; on the CPU neither does.
  auto with_recipe = [&](const char* recipe, bool cuda) {
    config::RunConfig r = run;
    r.precision.recipe = config::parse_config(std::string("precision: {recipe: ") + recipe + "}", "r", {}).precision.recipe;
    if (cuda) r.runtime.device = config::RuntimeDevice::Cuda;
    return plan_memory(r, {.tp = 1, .dp = 1, .pp = 1}).stages[0].activations_per_micro_batch;
  };
  const int64_t per_tensor_gpu = 16 * (16 + 16 + 16 + 32) - 2 * 16 * (32 + 16) - 2 * 16 * 32 - 2 * 2 * 16 * 16;
  EXPECT_EQ(with_recipe("fp8_current", true) - with_recipe("fp8_blockwise", true), per_tensor_gpu);
  EXPECT_EQ(with_recipe("fp8_delayed", true) - with_recipe("fp8_blockwise", true), per_tensor_gpu);
  config::RunConfig every_block_fp8 = run;  // no bf16 edge blocks: no activation nor norm output kept at all
  every_block_fp8.precision.recipe = config::PrecisionRecipe::Fp8Current;
  every_block_fp8.precision.fp8_edge_layers_bf16 = false;
  every_block_fp8.runtime.device = config::RuntimeDevice::Cuda;
  EXPECT_EQ(with_recipe("fp8_current", true) -
                plan_memory(every_block_fp8, {.tp = 1, .dp = 1, .pp = 1}).stages[0].activations_per_micro_batch,
            2 * 16 * 32 + 2 * 2 * 16 * 16);
  // Under sequence parallelism over tp > 1 the norms keep their fp32 outputs (the projection
  // gathers them first); tp 1 or tensor parallelism alone lets the norms write the codes.
  config::RunConfig sequence_parallel = every_block_fp8;
  sequence_parallel.parallel.sequence_parallel = true;
  EXPECT_TRUE(fp8_normed_codes_on_device(every_block_fp8, 2));
  EXPECT_TRUE(fp8_normed_codes_on_device(sequence_parallel, 1));
  EXPECT_FALSE(fp8_normed_codes_on_device(sequence_parallel, 2));
  EXPECT_FALSE(fp8_normed_codes_on_device(run, 1));  // the CPU
  EXPECT_EQ(with_recipe("fp8_current", false), with_recipe("fp8_blockwise", false));
  // Under bf16 a GPU keeps 2 of 4 bytes of the logits (16 x 16), the MLP's hidden and activation
  // (16 x (64 + 32)), q/k/v (16 x 32), the attention output (16 x 16) and the two norms' outputs
  // (16 x 16 each); under FP8 of the logits (a bf16 head) and the MLP's hidden (its GEMM's bf16
  // output: Mlp::bf16_hidden).
  EXPECT_EQ(with_recipe("bf16", false) - with_recipe("bf16", true), 2 * 16 * (16 + 64 + 32 + 32 + 16 + 16 + 16));
  EXPECT_EQ(with_recipe("fp8_blockwise", false) - with_recipe("fp8_blockwise", true), 2 * 16 * (16 + 64));
}

// Context parallelism over 2 ranks: each holds half of every sequence, so its activations are
// those of a run at half the sequence length, plus, under Ulysses (a2a), its heads' gathered
// q/k/v and output for backward; its workspace adds the exchange buffers (the ring's key/value
// blocks and their gradients, two each, and a block's partial output and log-sum-exp; Ulysses'
// send and receive blocks and its heads' output and q/k/v gradients); and ZeRO shards over the
// data- and context-parallel ranks together.
TEST(ActivationMemory, ContextParallelRanksHoldHalfOfEachSequenceAndTheExchangeBuffers) {
  config::RunConfig half = config::parse_config(kHandModel, "hand", {});
  half.data.seq_len = 4;
  const StageMemory alone = plan_memory(half, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  // 8 rows of this rank: q 16, k and v 8 each (head size 8), 2 heads.
  const int64_t rows = 8, q = 16, kv = 8, qkv = 32;
  for (const char* comm : {"p2p", "a2a"}) {
    SCOPED_TRACE(comm);
    const config::RunConfig run =
        config::parse_config(kHandModel, "hand", {"parallel.cp=2", std::string("parallel.cp_comm=") + comm});
    const StageMemory split = plan_memory(run, {.tp = 1, .cp = 2, .dp = 1, .pp = 1}).stages[0];
    const bool ring = std::string(comm) == "p2p";
    EXPECT_EQ(split.activations_per_micro_batch - alone.activations_per_micro_batch, ring ? 0 : rows * (qkv + q) * 4);
    EXPECT_EQ(split.workspace - alone.workspace,
              (ring ? rows * (4 * 2 * kv + q) + 2 * 2 * 4 : rows * (3 * qkv + q)) * 4);
  }
  const StageMemory zero = plan_memory(tiny({"parallel.cp=2", "parallel.zero=1"}), {.tp = 1, .cp = 2, .dp = 1, .pp = 1})
                               .stages[0];
  EXPECT_EQ(zero.state.optimizer_moments, 8 * ((kTiny + 1) / 2));
}

// Expert parallelism: a rank registers its share of each MoE layer's routed experts, and its
// state splits as the trainer's parameter groups do: the rest reduced (and ZeRO-sharded) over
// dp x cp, the routed experts over the expert-data-parallel ranks (tp x cp x dp / ep), where ZeRO
// still keeps a master and moments of its own even over one rank.
TEST(MemoryPlan, ExpertParallelRanksHoldTheirExpertsAndShardThemOverTheExpertDataParallelRanks) {
  // One dense layer and one MoE layer of 4 experts (SwiGLU of 16: gate/up 32 x 16, down 16 x 16).
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 2, heads: 2, ffn_size: 32, tied_embeddings: false,
        block_configs: [{ffn: dense}, {ffn: moe}], moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16}
data: {seq_len: 8}
train: {global_batch: 4, micro_batch: 2}
)";
  const config::RunConfig run = config::parse_config(yaml, "moe", {"parallel.zero=1"});
  const int64_t expert = 32 * 16 + 16 * 16;
  const StageMemory one = plan_memory(run, {.tp = 1, .ep = 1, .dp = 2, .pp = 1}).stages[0];
  const int64_t dense = one.parameter_count - 4 * expert;
  const StageMemory ep = plan_memory(run, {.tp = 1, .ep = 2, .dp = 2, .pp = 1}).stages[0];
  EXPECT_EQ(ep.parameter_count, dense + 2 * expert);  // experts 0 and 1 of rank 0
  EXPECT_EQ(ep.state.parameters, 4 * (dense + 2 * expert));
  EXPECT_EQ(ep.state.optimizer_moments, 8 * ((dense + 1) / 2 + 2 * expert));  // experts over 2 / 2 = 1 rank
  EXPECT_EQ(ep.state.master_weights, 4 * ((dense + 1) / 2 + 2 * expert));
  EXPECT_EQ(one.state.optimizer_moments, 8 * ((one.parameter_count + 1) / 2));  // one group over dp 2
  // Folded onto the tensor-parallel ranks (tp 2 x dp 2, ep 4): one expert a rank, its group over
  // tp x dp / ep = 1 rank; at ep 1 every tp rank holds all four, in the one group over dp.
  const StageMemory tp_only = plan_memory(run, {.tp = 2, .ep = 1, .dp = 2, .pp = 1}).stages[0];
  const int64_t tp_dense = tp_only.parameter_count - 4 * expert;
  EXPECT_EQ(tp_only.state.optimizer_moments, 8 * ((tp_only.parameter_count + 1) / 2));
  const StageMemory folded = plan_memory(run, {.tp = 2, .ep = 4, .dp = 2, .pp = 1}).stages[0];
  EXPECT_EQ(folded.parameter_count, tp_dense + expert);
  EXPECT_EQ(folded.state.optimizer_moments, 8 * ((tp_dense + 1) / 2 + expert));
}

// A hybrid small enough to count by hand (batch 2, seq 8: 16 rows, d_model 16): a Mamba-2 mixer
// (2 heads of 8, one group of state 4) and a MoE layer (4 experts of SwiGLU 8, top 2, a shared
// SwiGLU expert of 8), and the same with a second MoE layer.
constexpr const char* kHandHybrid = R"(
model: {vocab_size: 16, d_model: 16, layers: 2, layer_pattern: ME, heads: 2, ffn_size: 32, tied_embeddings: false,
        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8, moe_shared_ffn_size: 8,
        mamba: {state_size: 4, heads: 2, head_dim: 8, groups: 1, conv_kernel: 4, chunk_size: 4}}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";

TEST(ActivationMemory, MambaMixersAndMoeLayersKeepTheirTensorsAndShareOneScratch) {
  const config::RunConfig run = config::parse_config(kHandHybrid, "hybrid", {});
  const StageMemory one = plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  // Mamba: its norm 16x16 + 16 rstd, its sum 256, in_proj's output 16 x (z 16, x 16, B 4, C 4,
  // dt 2), the convolution's 16 x (16 + 4 + 4), the scan's and the gated norm's outputs 16 x 16
  // each, and the gated norm's statistics 16 x 1.
  const int64_t mamba = 272 + 256 + 16 * (42 + 24 + 16 + 16 + 1);
  // MoE: its norm 272, router logits 16 x 4, 32 routed rows' tokens and weights, the 32
  // selections' experts, weights and dispatched rows (the router's backward), dispatched and
  // returned rows 32 x 16 each, combined 16 x 16, the experts' hidden 32 x 16 and activation 32 x
  // 8, the shared expert's hidden 16 x 16 and activation 16 x 8.
  const int64_t moe = 272 + 64 + 2 * 32 + 3 * 32 + 2 * 512 + 256 + 512 + 256 + 256 + 128;
  EXPECT_EQ(one.activations_per_micro_batch, (256 + 3 * 256 + mamba + moe + 272 + 256) * 4 + 16 * 4);
  // A second MoE layer keeps its own tensors and the stream after it; its scratch is the first's.
  const config::RunConfig two =
      config::parse_config(kHandHybrid, "hybrid", {"model.layers=3", "model.layer_pattern=MEE"});
  const StageMemory more = plan_memory(two, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  EXPECT_EQ(more.activations_per_micro_batch - one.activations_per_micro_batch, (moe + 256) * 4);
  EXPECT_EQ(more.workspace, one.workspace);
  // Recompute keeps one Block::Saved: the mixer's norm and sum, and the MoE layer's tensors.
  config::RunConfig recompute = two;
  recompute.model.recompute = true;
  const StageMemory again = plan_memory(recompute, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  EXPECT_EQ(again.workspace - more.workspace, (mamba + moe + 256) * 4);  // and the recomputed block's output
  // A capacity factor of 0.5 caps each expert at ceil(0.5 x 32 / 4) = 4 rows: 16 routed rows.
  const config::RunConfig capped = config::parse_config(kHandHybrid, "hybrid", {"model.moe_capacity_factor=0.5"});
  const StageMemory cap = plan_memory(capped, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  EXPECT_EQ(one.activations_per_micro_batch - cap.activations_per_micro_batch,
            16 * (2 + 2 * 16 + 16 + 8) * 4);
  // Under an FP8 recipe each expert's rows are padded to 16 (ExpertMlp::padded_rows), planned at
  // the bound of 15 more each: the experts keep their hidden and activation over 32 + 4 x 15 rows,
  // and the shared scratch gains the padded input, output and input gradient (92 x 16 each); an
  // expert's 23 rows x 16 become the widest input the precision scratch copies (the head's 16 x 16).
  const config::RunConfig fp8 = config::parse_config(
      kHandHybrid, "hybrid", {"precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false"});
  const StageMemory padded = plan_memory(fp8, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  EXPECT_EQ(padded.activations_per_micro_batch - one.activations_per_micro_batch, 4 * 15 * (16 + 8) * 4);
  config::RunConfig unpadded = fp8;
  unpadded.precision.recipe = config::PrecisionRecipe::Mxfp8;  // no padding: the same scratch but that
  EXPECT_EQ(padded.workspace - plan_memory(unpadded, {.tp = 1, .dp = 1, .pp = 1}).stages[0].workspace,
            3 * 92 * 16 * 4 + 4 * 15 * (16 + 8) * 4 + (23 - 16) * 16 * 4);  // Workspace's d_hidden, d_act too
  // On a device under fp8_current the weight cast cache holds 2 bytes per element (FP8 codes in
  // both orientations) of the mixer's projections (in_proj 42 x 16, out_proj 16 x 16), the shared
  // expert's (3 x 8 x 16) and the routed experts' (4 x 3 x 8 x 16), and the head's bf16 cast (16 x
  // 16) where the optimizer's bf16 copy does not serve it; not of the router.
  config::RunConfig device = run;
  device.runtime.device = config::RuntimeDevice::Cuda;
  device.precision.recipe = config::PrecisionRecipe::Fp8Current;
  ShapeGroup single(1, 0);
  const std::vector<model::Parameter> params = model::Transformer::parameter_list(
      device.model, model::TensorParallel(&single, false), {{0, 2}}, model::ExpertLayout{1, 0});
  const bool copy = parallel::keeps_bf16_parameter_copy(device);
  EXPECT_EQ(weight_cast_cache_bytes(device, params, 16),
            2 * (42 * 16 + 16 * 16 + 3 * 8 * 16 + 4 * 3 * 8 * 16) + (copy ? 0 : 2 * 16 * 16));
}

// On a GPU the scan's backward takes its work arrays for the call beside the workspace (the loops
// form, kernels/ssd_scan_work.h), counted by hand for the mixer above: batch 2, seq 8, 2 heads of
// 8, one group of state 4, blocks of 4 tokens (2 per row). Each row's block boundaries (int32, 2 x 9
// + 2); doubles: the states entering each block (2 x 2 x 2 x 8 x 4), each (row, head)'s forward
// work (its state 32, a block's 16 weights, 12 per-token values: 2 x 2 x 60), the group's block dot
// products (2 x 8 x 4), three parameter partials and the backward work (the state gradient 32,
// three 4 x 4 pair terms, 20 per-token values, 4 x 8, and the forward work again 60: 2 x 2 x 192),
// and the heads' dB and dC shares (2 x 2 x 8 x 4 each).
TEST(ActivationMemory, AGpuPlansTheScansWorkArrays) {
  config::RunConfig run = config::parse_config(kHandHybrid, "hybrid", {});
  const int64_t cpu = plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}).stages[0].workspace;
  run.runtime.device = config::RuntimeDevice::Cuda;
  const int64_t gpu = plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}).stages[0].workspace;
  const int64_t doubles = 2 * 2 * 2 * 8 * 4 + 2 * 2 * 60 + 2 * 8 * 4 + 2 * 2 * 3 + 2 * 2 * 192 + 2 * 2 * 2 * 8 * 4;
  EXPECT_EQ(gpu - cpu, 4 * (2 * 9 + 2) + 8 * doubles);
}

// On a GPU, cuBLASLt's FP8 products take only dimensions that are multiples of 16: the plan refuses
// a layout whose linear would not run (the mixer's in_proj 42 wide), naming the layer and its
// widths, as the model would stop at its first FP8 GEMM; bf16, the CPU, and the bf16 edge blocks
// plan it. So are experts 8 wide, and a micro-batch of 8 tokens (the experts' rows are padded).
TEST(DeviceShapes, Fp8LayoutsWhoseGemmsCuBlasLtRefusesAreRefusedNamingTheLayer) {
  const std::vector<std::string> fp8 = {"precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false"};
  auto plan = [&](std::vector<std::string> overrides) {
    return plan_memory(config::parse_config(kHandHybrid, "hybrid", overrides), {.tp = 1, .dp = 1, .pp = 1});
  };
  auto refusal = [&](std::vector<std::string> overrides) {
    try {
      plan(std::move(overrides));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("planned");
  };
  std::vector<std::string> cuda = fp8;
  cuda.push_back("runtime.device=cuda");
  const std::string mixer = refusal(cuda);
  EXPECT_NE(mixer.find("multiple of 16, and layer 0's a Mamba-2 mixer's or shared expert's projection is 42 x 16"),
            std::string::npos) << mixer;
  EXPECT_NE(mixer.find("precision.recipe=fp8_current on runtime.device=cuda"), std::string::npos) << mixer;
  EXPECT_EQ(refusal(fp8), "planned");  // the CPU emulates any shape
  EXPECT_EQ(refusal({"precision.recipe=fp8_current", "runtime.device=cuda"}), "planned");  // edge blocks bf16
  EXPECT_EQ(refusal({"precision.recipe=bf16", "runtime.device=cuda"}), "planned");
  // A dense MLP (up 64 x 16, down 16 x 32) and the MoE layer with experts of 16 plan; at 8 tokens
  // per micro-batch they do not.
  std::vector<std::string> aligned = cuda;
  aligned.insert(aligned.end(), {"model.layer_pattern=-E", "model.moe_ffn_size=16", "model.moe_shared_ffn_size=16"});
  EXPECT_EQ(refusal(aligned), "planned");
  std::vector<std::string> narrow_experts = cuda;
  narrow_experts.insert(narrow_experts.end(), {"model.layer_pattern=-E", "model.moe_shared_ffn_size=16"});
  const std::string experts = refusal(narrow_experts);
  EXPECT_NE(experts.find("layer 1's a routed expert's down projection is 16 x 8"), std::string::npos) << experts;
  aligned.push_back("train.micro_batch=1");
  aligned.push_back("train.global_batch=1");
  const std::string tokens = refusal(aligned);
  EXPECT_NE(tokens.find("layer 0's the MLP's up projection is 64 x 16 (output x input features on this rank) over 8 "
                        "tokens"), std::string::npos) << tokens;
  // The search drops every such layout, and with none left says why the first was refused.
  const LayoutCheck check = [](const config::RunConfig& c, int devices) {
    return comm::MeshShape{.tp = c.parallel.tp, .dp = devices / c.parallel.tp, .pp = c.parallel.pp};
  };
  Hardware roomy;
  roomy.memory_bytes = 1e12;
  roomy.peak_flops = 1e12;
  const SearchResult none = search_layouts(config::parse_config(kHandHybrid, "hybrid", cuda), roomy, 1, check);
  EXPECT_TRUE(none.ranked.empty());
  EXPECT_EQ(none.refused, none.enumerated);
  EXPECT_NE(none.first_refusal.find("parallel.tp=1 "), std::string::npos) << none.first_refusal;
  EXPECT_NE(none.first_refusal.find("(precision.recipe=fp8_current on runtime.device=cuda"), std::string::npos)
      << none.first_refusal;
  EXPECT_NE(search_table(none, 5).find("the first refused: parallel.tp=1"), std::string::npos);
}

// Under sequence parallelism every tensor-parallel rank computes its own rows' share of the
// gradients of what it holds whole (norms, router, experts), summed over the group a layer at a
// time through two buffers as large as the largest layer's such gradients.
TEST(ActivationMemory, SequenceParallelRanksSumTheirReplicatedGradientsThroughTwoBuffers) {
  const config::RunConfig run = config::parse_config(kHandHybrid, "hybrid", {"model.layer_pattern='*E'"});
  ShapeGroup group(2, 0);
  const model::TensorParallel tp(&group, true);
  const std::vector<model::Parameter> params =
      model::Transformer::parameter_list(run.model, tp, {{0, 2}}, model::ExpertLayout{1, 0});
  // The MoE layer's: its norm 16, router 4 x 16, experts 4 x (2 x 8 x 16 + 16 x 8).
  const int64_t moe_layer = 16 + 64 + 4 * 384;
  EXPECT_EQ(tensor_parallel_gradient_sum_bytes(params, 2, 2), 2 * moe_layer * 4);
  EXPECT_EQ(tensor_parallel_gradient_sum_bytes(params, 2, 1), 0);
}

// Nemotron-4 340B's shape (96 layers, hidden 18432, 96 heads / 8 kv heads, a non-gated MLP of
// 73728, vocabulary 256000, untied): 341B parameters, and mixed-precision Adam's 18 bytes each
// give the published ~6120 GB (18 x 340B) of model state, planned in milliseconds.
TEST(MemoryPlan, A340BModelHoldsAbout6120GBOfState) {
  const std::string yaml = R"(
model: {vocab_size: 256000, d_model: 18432, layers: 96, heads: 96, kv_heads: 8, ffn_size: 73728,
        activation: gelu, norm: layer, tied_embeddings: false, max_seq_len: 4096}
data: {seq_len: 4096}
train: {global_batch: 8, micro_batch: 1}
precision: {recipe: bf16, param_dtype: compute}
)";
  const config::RunConfig run = config::parse_config(yaml, "340b", {});
  const StageMemory s = plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}).stages[0];
  const double state = static_cast<double>(s.state.parameters + s.state.gradients + s.state.master_weights +
                                           s.state.optimizer_moments);
  EXPECT_EQ(state, 18.0 * static_cast<double>(s.parameter_count));
  EXPECT_NEAR(static_cast<double>(s.parameter_count) / 1e9, 341.0, 1.0);
  EXPECT_NEAR(state / 1e9, 6120.0, 0.01 * 6120.0);
}

}  // namespace
}  // namespace loom::plan
