// Step time under tensor parallelism, counted by hand: what every rank computes whole (a MoE
// layer's router forward), what it computes over its share of the tokens (the router's backward,
// the latent projections, the routed experts) and the bytes its collectives move.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "loom/plan/time_plan.h"

namespace loom::plan {
namespace {

// 1 TFLOP/s (attention and FP8 too unless set), no casts, free GEMM outputs.
Hardware device(int activation_bytes = 4) {
  return parse_hardware(R"(
device: {peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbs: 1000000, activation_bytes: )" +
                            std::to_string(activation_bytes) + R"(}
ranks_per_node: 8
links: {node_bandwidth_gbps: 8, node_latency_us: 1}
)",
                        "test.yaml");
}

// An attention layer and a latent MoE layer with a gated shared expert, and one multi-token
// prediction depth (its block attention and the MoE); one micro-batch of 2 x 8 tokens.
const char* const kAttentionAndMoe = R"(
model: {vocab_size: 16, d_model: 16, layers: 2, layer_pattern: '*E', heads: 2, kv_heads: 2, ffn_size: 32,
        tied_embeddings: false, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8, moe_latent_size: 8,
        moe_shared_ffn_size: 8, moe_shared_expert_gate: true, mtp_depths: 1}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";

// Every tensor-parallel rank runs the router's forward over all the group's tokens, so at tp 2 it
// costs a rank as much as at tp 1; the router's backward, the latent projections and the routed
// experts run over the rank's share of the tokens (TensorParallel::row_part), and attention, the shared
// expert and the heads are split: each costs a rank half.
// Training FLOPs per token (3 x 2 x weights), d_model 16, 2 heads of 8, SwiGLU:
//   attention   q/k/v 48 x 16 and output 16 x 16: 6144; scores and values over 4.5 keys: 864
//   MoE         router 4 x 16: 384; latent down 8 x 16 and up 16 x 8: 1536; top 2 experts' gate/up
//               16 x 8 and down 8 x 8: 2304; shared expert 16 x 16 and 16 x 8: 2304; its gate: 96
//   heads       16 x 16 each, the layers' and the depth's: 2 x 1536
//   eh_proj     16 x 32: 3072, whole on every rank
// The depth's block counts its attention and MoE again. The shared expert's gate sees each rank's
// own rows under sequence parallelism (MoeLayer::shared_forward), all of them without.
TEST(TensorParallelTime, MoeRoutersRunWholeAndTheRoutedPartOverEachRanksShareOfTheTokens) {
  Hardware hw = device();
  const auto plan = [&](const std::vector<std::string>& overrides) {
    const config::RunConfig run = config::parse_config(kAttentionAndMoe, "moe", overrides);
    const MemoryPlan memory = plan_memory(run, {.tp = 2, .dp = 1, .pp = 1});
    // Per micro-batch the elementwise kernels' pass over the activations, as every layout's.
    const double elementwise = memory.stages[0].activations_per_micro_batch / hw.activation_rate_per_rank(1);
    return std::pair{plan_time(run, memory, hw).compute, elementwise};
  };
  const double tokens = 16, attention = 6144, scores = 864, router = 384, latent = 1536, experts = 2304;
  const double shared = 2304, gate = 96, heads = 2 * 1536, eh_proj = 3072;
  const double split = 2 * (attention + scores + shared + 2 * router / 3 + latent + experts) + heads;
  const double whole = 2 * router / 3 + eh_proj;
  const auto [fp32, fp32_elementwise] = plan({"parallel.tp=2"});
  EXPECT_NEAR(fp32, tokens * (split / 2 + whole + 2 * gate) / 1e12 + fp32_elementwise, 1e-15);
  const auto [sp, sp_elementwise] = plan({"parallel.tp=2", "parallel.sequence_parallel=true"});
  EXPECT_NEAR(sp, tokens * ((split + 2 * gate) / 2 + whole) / 1e12 + sp_elementwise, 1e-15);
  // Under fp8_current (no bf16 edge layers) at twice the rate: the split linears' half and the
  // routed experts' half in FP8, with each MoE layer's padding (4 experts x 15 rows through both
  // projections, per micro-batch); the router, the latent projections, the gate and eh_proj stay
  // fp32, the heads bf16.
  hw.fp8_peak_flops = 2e12;
  const auto [fp8, fp8_elementwise] =
      plan({"parallel.tp=2", "precision.recipe=fp8_current", "precision.fp8_edge_layers_bf16=false"});
  const double split_fp8 = 2 * (attention + shared + experts);
  const double at_gemm_rate = (2 * (scores + 2 * router / 3 + latent) + heads) / 2 + 2 * (router / 3 + gate) + eh_proj;
  const double padding = 2 * 4 * 15 * 6 * (16 * 8 + 8 * 8) / 2e12;
  EXPECT_NEAR(fp8, tokens * (at_gemm_rate / 1e12 + split_fp8 / 2 / 2e12) + padding + fp8_elementwise, 1e-15);
}

// A layer of each region kind that communicates: attention, a dense MLP, and a MoE layer with a
// shared expert; one micro-batch of 2 x 8 tokens, the residual stream 16 wide.
const char* const kRegions = R"(
model: {vocab_size: 16, d_model: 16, layers: 3, layer_pattern: '*-E', heads: 2, kv_heads: 2, ffn_size: 32,
        tied_embeddings: false, moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8, moe_shared_ffn_size: 8}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";

// The model's tensor-parallel reductions and gathers move fp32 (TensorParallel's DType::F32) on
// the CPU and on a GPU alike, whatever the hardware file stores activations in (activation_bytes
// 2 here): 4 bytes per element of the 16 x 16 rows. Only under sequence parallelism on a GPU under
// the bf16 recipe are attention's and the dense MLP's inputs, which their norms write in bf16,
// gathered in bf16 (TensorParallel::enter_forward_bf16), forward and again for wgrad.
TEST(TensorParallelTime, CollectivesMoveFp32WhateverTheActivationsAreStoredIn) {
  const Hardware hw = device(2);
  const Link& link = hw.link(comm::LinkClass::SameNode);
  const auto plan = [&](std::vector<std::string> overrides) {
    overrides.push_back("parallel.overlap_tp_comm=false");  // every collective waited for (below: overlapped)
    const config::RunConfig run = config::parse_config(kRegions, "regions", overrides);
    const MemoryPlan memory = plan_memory(run, {.tp = 2, .dp = 1, .pp = 1});
    return std::pair{memory.stages[0], plan_time(run, memory, hw)};
  };
  const double rows = 16 * 16;
  const double reduce = all_reduce_seconds(4 * rows, 2, link), gather = all_gather_seconds(4 * rows, 2, link);
  const double bf16_gather = all_gather_seconds(2 * rows, 2, link);
  // Three regions (attention, the MLP, the shared expert) all-reduce once forward and once
  // backward, the routed part all-gathers its shares' outputs and their input gradients (each row
  // is one rank's); the lookup all-reduces forward, the head backward; then the fp32 sums of the
  // router's and experts' gradients, which each rank computes over its share of the tokens.
  for (const char* device : {"cpu", "cuda"}) {
    const auto [stage, t] = plan({"parallel.tp=2", "precision.recipe=bf16", std::string("runtime.device=") + device});
    double summed = 0.0;
    for (const int64_t n : stage.tp_gradient_sums) summed += all_reduce_seconds(4.0 * n, 2, link);
    EXPECT_EQ(stage.tp_gradient_sums, (std::vector<int64_t>{4 * 16 + 4 * 3 * 8 * 16})) << device;
    EXPECT_NEAR(t.tp_comm, 8 * reduce + 2 * gather + summed, 1e-15) << device;
  }
  // Sequence parallelism on a GPU under bf16. Forward: the shared expert's input, the routed
  // part's, the head's gathered in fp32, the three regions' outputs and the lookup reduce-scattered;
  // backward: the three regions' output gradients, the shared expert's input again and the lookup's
  // gathered, the three regions' input gradients and the head's reduce-scattered (the routed part's
  // input gradient is the rank's own rows'); then the fp32 sums of the gradients every rank holds
  // whole.
  const auto [stage, t] = plan({"parallel.tp=2", "parallel.sequence_parallel=true", "precision.recipe=bf16",
                                "runtime.device=cuda"});
  double summed = 0.0;
  for (const int64_t n : stage.tp_gradient_sums) summed += all_reduce_seconds(4.0 * n, 2, link);
  EXPECT_NEAR(t.tp_comm, 4 * bf16_gather + (7 + 9) * gather + summed, 1e-15);
  // On the CPU every gather is fp32.
  const auto [cpu_stage, cpu] = plan({"parallel.tp=2", "parallel.sequence_parallel=true", "precision.recipe=bf16"});
  EXPECT_NEAR(cpu.tp_comm, (4 + 7 + 9) * gather + summed, 1e-15);
}

// parallel.overlap_tp_comm: each column-parallel layer (here attention's q/k/v, 48 x 16, and the
// MLP's gate/up, 64 x 16: at tp 2 a rank's 24 and 32 output features) hides its input gradient's
// sum behind its wgrad GEMM and, under sequence parallelism, its input's second gather behind its
// dgrad GEMM, each as far as the GEMM (2 x 16 rows x its features x 16 FLOPs) lasts: the whole
// collective on a slow core, the GEMM's time on a fast one. The step shortens by what is hidden.
TEST(TensorParallelTime, ColumnParallelBackwardsHideTheirCollectivesBehindTheirGemms) {
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 1, heads: 2, kv_heads: 2, ffn_size: 32, tied_embeddings: false}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";
  const double stream = 16 * 16;
  for (const double tflops : {1e-6, 1.0}) {
    Hardware hw = device();
    hw.peak_flops = tflops * 1e12;
    const Link& link = hw.link(comm::LinkClass::SameNode);
    const double reduce = all_reduce_seconds(4 * stream, 2, link), gather = all_gather_seconds(4 * stream, 2, link);
    const double qkv = 2 * stream * 24 / hw.peak_flops, up = 2 * stream * 32 / hw.peak_flops;
    for (const bool sp : {false, true}) {
      SCOPED_TRACE(std::to_string(tflops) + " TFLOP/s" + (sp ? ", sequence parallel" : ""));
      const auto time = [&](bool overlap) {
        const config::RunConfig run = config::parse_config(
            yaml, "dense",
            {"parallel.tp=2", "parallel.sequence_parallel=" + std::string(sp ? "true" : "false"),
             "parallel.overlap_tp_comm=" + std::string(overlap ? "true" : "false")});
        return plan_time(run, plan_memory(run, {.tp = 2, .dp = 1, .pp = 1}), hw);
      };
      const TimeBreakdown waited = time(false), overlapped = time(true);
      double hidden = 0.0;
      for (const double gemm : {qkv, up}) {
        hidden += sp ? std::min(gather, gemm) + std::min(gather, gemm) : std::min(reduce, gemm);
      }
      EXPECT_GT(hidden, 0.0);
      EXPECT_NEAR(waited.tp_comm - overlapped.tp_comm, hidden, 1e-15);
      EXPECT_EQ(waited.tp_comm_hidden, 0.0);
      EXPECT_NEAR(overlapped.tp_comm_hidden, hidden, 1e-15);  // one micro-batch
      EXPECT_NEAR(waited.step - overlapped.step, hidden, 1e-12);
    }
  }
}

// Context parallelism's exchanges and the pipeline's sends move fp32 too
// (parallel/context/communication.cpp, parallel/pipeline/communication.cpp).
TEST(TensorParallelTime, ContextAndPipelineExchangesMoveFp32) {
  const Hardware hw = device(2);
  const Link& link = hw.link(comm::LinkClass::SameNode);
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 2, heads: 2, kv_heads: 2, ffn_size: 32, tied_embeddings: false}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";
  // Ulysses: per attention layer four all-to-alls of the rank's 8 rows, q/k/v (48) and the output (16)
  // wide, half of each crossing.
  const config::RunConfig cp = config::parse_config(yaml, "cp", {"parallel.cp=2", "parallel.cp_comm=a2a"});
  const TimeBreakdown c = plan_time(cp, plan_memory(cp, {.tp = 1, .cp = 2, .dp = 1, .pp = 1}), hw);
  auto all_to_all = [&](double bytes) { return link.latency + bytes / 2 / link.bandwidth; };
  EXPECT_NEAR(c.cp_comm, 2 * 2 * (all_to_all(8 * 48 * 4) + all_to_all(8 * 16 * 4)), 1e-15);
  // Two stages: each sends its 16 rows forward or their gradient backward, one send each way.
  const config::RunConfig pp = config::parse_config(yaml, "pp", {"parallel.pp=2"});
  const TimeBreakdown p = plan_time(pp, plan_memory(pp, {.tp = 1, .dp = 1, .pp = 2}), hw);
  EXPECT_NEAR(p.pp_comm, 2 * (link.latency + 16 * 16 * 4 / link.bandwidth), 1e-15);
}

}  // namespace
}  // namespace loom::plan
