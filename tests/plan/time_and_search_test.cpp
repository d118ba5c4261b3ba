// Step time's parts and the layout search, on hardware whose numbers make them easy to check.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>

#include "loom/core/error.h"
#include "loom/model/flops.h"
#include "loom/model/layer_spec.h"
#include "loom/plan/search.h"
#include "loom/plan/time_plan.h"

namespace loom::plan {
namespace {

config::RunConfig tiny(const std::vector<std::string>& overrides) {
  const std::string yaml = R"(
model: {vocab_size: 256, d_model: 256, layers: 6, heads: 8, kv_heads: 4, ffn_size: 704, max_seq_len: 256}
data: {seq_len: 128}
train: {global_batch: 8, micro_batch: 4}
)";
  return config::parse_config(yaml, "tiny", overrides);
}

Hardware device() {
  return parse_hardware(R"(
device: {peak_tflops: 1, memory_gib: 1, memory_bandwidth_gbs: 1000000}
ranks_per_node: 8
links: {node_bandwidth_gbps: 8, node_latency_us: 1}
)",
                        "test.yaml");
}

TEST(TimePlan, RingCollectivesCostBandwidthAndLatency) {
  const Link link{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(all_reduce_seconds(1e9, 1, link), 0.0);
  EXPECT_NEAR(all_reduce_seconds(1e9, 4, link), 6e-6 + 1.5, 1e-12);  // 2(n-1) steps, 2(n-1)/n of the bytes
  EXPECT_NEAR(all_gather_seconds(1e9, 4, link), (6e-6 + 1.5) / 2, 1e-12);
}

TEST(TimePlan, ComputeIsTheFlopsOverTheRateAndThePipelineAddsItsBubble) {
  const Hardware hw = device();
  const config::RunConfig one = tiny({});
  const TimeBreakdown t = plan_time(one, plan_memory(one, {.tp = 1, .dp = 1, .pp = 1}), hw);
  EXPECT_EQ(t.bubble, 0.0);
  EXPECT_EQ(t.tp_comm + t.pp_comm + t.dp_comm, 0.0);
  EXPECT_GT(t.compute, 0.0);
  EXPECT_DOUBLE_EQ(t.step, t.compute + t.optimizer);
  // Two stages, 1F1B, 4 micro-batches: the bubble is (p - 1) / m of the busy time, and the
  // per-stage compute about halves.
  const config::RunConfig pp = tiny({"parallel.pp=2", "train.micro_batch=2"});
  const TimeBreakdown p = plan_time(pp, plan_memory(pp, {.tp = 1, .dp = 1, .pp = 2}), hw);
  EXPECT_NEAR(p.bubble / (p.compute + p.pp_comm), 1.0 / 4.0, 1e-9);
  EXPECT_LT(p.compute, 0.7 * t.compute);
  EXPECT_GT(p.pp_comm, 0.0);
}

TEST(TimePlan, DataParallelCommunicationIsTheGradientAllReduce) {
  const config::RunConfig run = tiny({});
  const MemoryPlan memory = plan_memory(run, {.tp = 1, .dp = 2, .pp = 1});
  const TimeBreakdown t = plan_time(run, memory, device());
  const double bytes = 4.0 * static_cast<double>(memory.stages[0].parameter_count);
  EXPECT_NEAR(t.dp_comm, all_reduce_seconds(bytes, 2, Link{1e9, 1e-6}), 1e-12);
}

// ZeRO 1-2: the gradients' reduce-scatter hides behind backward as far as the hardware's
// comm_overlap says; the parameter all-gather after the update is waited for whole, or with
// parallel.overlap_param_gather only what outlasts the first micro-batch's forward, and at least
// the first bucket's share.
TEST(TimePlan, TheParameterGatherIsWaitedForUnlessItOverlapsTheForward) {
  for (const int zero : {1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const std::string stage = "parallel.zero=" + std::to_string(zero);
    auto dp_comm = [&](const std::vector<std::string>& more, double gbps) {
      Hardware hw = device();
      hw.comm_overlap = 0.5;
      hw.links[static_cast<int>(comm::LinkClass::SameNode)].bandwidth = gbps * 1e9 / 8;
      std::vector<std::string> overrides = {stage};
      overrides.insert(overrides.end(), more.begin(), more.end());
      const config::RunConfig c = tiny(overrides);
      const MemoryPlan m = plan_memory(c, {.tp = 1, .dp = 2, .pp = 1});
      const TimeBreakdown t = plan_time(c, m, hw);
      const double gather = all_gather_seconds(4.0 * static_cast<double>(m.stages[0].parameter_count), 2,
                                               Link{gbps * 1e9 / 8, 1e-6});
      // One micro-batch a step: the reduce-scatter costs what the gather does.
      return std::tuple{t.dp_comm, gather, t.compute, static_cast<double>(m.stages[0].parameter_count)};
    };
    const auto [blocking, gather, compute, params] = dp_comm({}, 8);
    EXPECT_NEAR(blocking, 0.5 * gather + gather, 1e-12);
    // One bucket: nothing computes before the only bucket arrives.
    EXPECT_NEAR(std::get<0>(dp_comm({"parallel.overlap_param_gather=true", "parallel.bucket_mb=1000"}, 8)), blocking,
                1e-12);
    // A slow link: the forward hides its length of the gather (about a third of fwd + bwd).
    const std::vector<std::string> overlapped = {"parallel.overlap_param_gather=true", "parallel.bucket_mb=1"};
    const auto [slow_blocking, slow_gather, slow_compute, slow_params] = dp_comm({}, 0.1);
    const double hidden = slow_blocking - std::get<0>(dp_comm(overlapped, 0.1));
    EXPECT_GT(hidden, slow_compute / 4);
    EXPECT_LT(hidden, slow_compute / 2);
    EXPECT_LT(hidden, slow_gather);
    // A fast link: all but the first bucket's share hides behind the forward.
    const double buckets = std::ceil(4.0 * params / (1024.0 * 1024.0));
    const auto [fast_blocking, fast_gather, fast_compute, fast_params] = dp_comm({}, 800);
    ASSERT_LT(fast_gather, fast_compute / 4);
    const double fast = std::get<0>(dp_comm(overlapped, 800));
    EXPECT_NEAR(fast - 0.5 * fast_gather, fast_gather / buckets, 0.05 * fast_gather / buckets);
  }
}

// Context parallelism: a cp rank's micro-batch is seq_len / cp of each sequence, so its compute
// halves at cp 2 while its attention still sees every key; the exchanges are the ring's hops (the
// forward's and backward's block hops showing only where that block's attention compute does not
// cover them, backward's gradient hops all) or Ulysses' four all-to-alls; the gradients reduce
// over dp x cp (each rank's from its own tokens).
TEST(TimePlan, ContextParallelismSplitsTheTokensAndAddsItsExchanges) {
  const Hardware hw = device();
  const Link link{1e9, 1e-6};  // the file's 8 Gbit/s
  const config::RunConfig one = tiny({});
  const TimeBreakdown t1 = plan_time(one, plan_memory(one, {.tp = 1, .cp = 1, .dp = 1, .pp = 1}), hw);
  const double layers = 6, micro_batches = 2, rows = 4 * 128 / 2.0, e = 4;  // fp32 whatever activation_bytes
  const double q = 256, kv = 128;
  const double attention = model::attention_training_flops_per_token(
                               one.model, model::resolve_layers(one.model).front(), one.data.seq_len) *
                           rows / hw.attention_flops_per_rank(1);
  for (const char* comm : {"p2p", "a2a"}) {
    SCOPED_TRACE(comm);
    const config::RunConfig cp = tiny({"parallel.cp=2", std::string("parallel.cp_comm=") + comm});
    const TimeBreakdown t2 = plan_time(cp, plan_memory(cp, {.tp = 1, .cp = 2, .dp = 1, .pp = 1}), hw);
    EXPECT_GT(t2.compute, 0.45 * t1.compute);
    EXPECT_LT(t2.compute, 0.55 * t1.compute);
    double per_layer = 0.0;
    if (std::string(comm) == "a2a") {
      auto all_to_all = [&](double bytes) { return link.latency + bytes / 2 / link.bandwidth; };
      per_layer = 2 * (all_to_all(rows * (q + 2 * kv) * e) + all_to_all(rows * q * e));
    } else {
      const double hop = link.latency + rows * 2 * kv * e / link.bandwidth;
      per_layer = std::max(0.0, hop - attention / 3 / 2) + std::max(0.0, hop - 2 * attention / 3 / 2) + 2 * hop;
    }
    EXPECT_NEAR(t2.cp_comm, micro_batches * layers * per_layer, 1e-12);
  }
  // The gradients of each rank's tokens all-reduced over the ranks that hold the same
  // parameters: the 2 of cp 2, the 4 of dp 2 x cp 2.
  const config::RunConfig cp = tiny({"parallel.cp=2"});
  for (int dp : {1, 2}) {
    const MemoryPlan memory = plan_memory(cp, {.tp = 1, .cp = 2, .dp = dp, .pp = 1});
    const double bytes = 4.0 * static_cast<double>(memory.stages[0].parameter_count);
    EXPECT_NEAR(plan_time(cp, memory, hw).dp_comm, all_reduce_seconds(bytes, 2 * dp, link), 1e-12) << dp;
  }
}

// Expert parallelism: each MoE layer's routed rows (top_k per token, fp32 at the experts' width)
// go to the experts' ranks and back, forward and backward: four all-to-alls a layer and
// micro-batch, of which (ep - 1)/ep crosses.
TEST(TimePlan, ExpertParallelismAddsItsTokenExchanges) {
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 3, heads: 2, ffn_size: 32, tied_embeddings: false,
        block_configs: [{ffn: dense}, {ffn: moe}, {ffn: moe}], moe_experts: 4, moe_top_k: 2, moe_ffn_size: 16}
data: {seq_len: 8}
train: {global_batch: 4, micro_batch: 2}
)";
  const config::RunConfig run = config::parse_config(yaml, "moe", {});
  const Hardware hw = device();
  const Link link{1e9, 1e-6};
  EXPECT_EQ(plan_time(run, plan_memory(run, {.tp = 1, .ep = 1, .dp = 2, .pp = 1}), hw).ep_comm, 0.0);
  const TimeBreakdown t = plan_time(run, plan_memory(run, {.tp = 1, .ep = 2, .dp = 2, .pp = 1}), hw);
  const double rows = 2 * 8 * 2, bytes = rows * 16 * 4;  // 2 x 8 tokens, top 2, width 16, fp32
  const double one = link.latency + bytes / 2 / link.bandwidth;
  EXPECT_NEAR(t.ep_comm, 1 /* micro-batch */ * 2 /* MoE layers */ * 4 * one, 1e-15);
}

// The tiny model's linears per layer as (rows out, columns in): the fused q/k/v projection
// (8 heads of 32, 4 kv heads), the output projection, the fused gate/up and the down projection.
const std::vector<std::pair<double, double>> kTinyLinears = {{256 + 2 * 128, 256}, {256, 256}, {2 * 704, 256}, {256, 704}};

// The tiny model's blocks' linear weights (6 layers): their gradients are written whole.
double tiny_block_weights() {
  double weights = 0.0;
  for (const auto& [out, in] : kTinyLinears) weights += 6 * out * in;
  return weights;
}

// A device of 1 GB/s whose host link moves 0.2 GB/s and host memory 0.5 GB/s (offloaded state).
Hardware offload_device() {
  Hardware hw = device();
  hw.memory_bandwidth = 1e9;
  hw.host_link_bandwidth = 2e8;
  hw.host_memory_bandwidth = 5e8;
  return hw;
}

// bf16 on every linear, at 1 G elements/s and an unlimited bandwidth: each linear's copies and casts
// of its operands (input and weight twice, output gradient once) and of its three outputs.
TEST(TimePlan, PrecisionCastsEveryLinearOperandAndOutput) {
  Hardware hw = device();
  hw.bf16_cast_rate = 1e9;
  hw.fp8_cast_rate = 0.25e9;
  const config::RunConfig fp32 = tiny({});
  EXPECT_EQ(plan_time(fp32, plan_memory(fp32, {.tp = 1, .dp = 1, .pp = 1}), hw).casts, 0.0);
  const config::RunConfig bf16 = tiny({"precision.recipe=bf16"});
  const TimeBreakdown b = plan_time(bf16, plan_memory(bf16, {.tp = 1, .dp = 1, .pp = 1}), hw);
  const double n = 4 * 128;  // rows of a micro-batch
  double elements = 0.0, added = 0.0;  // cast or rounded; added into fp32 weight gradients (12 bytes each)
  auto linear = [&](double out, double in) {
    added += out * in;
    return n * (2 * in + out) + 2 * out * in + n * (out + in);  // the weight gradient is not rounded
  };
  for (int layer = 0; layer < 6; ++layer) {
    for (const auto& [out, in] : kTinyLinears) elements += linear(out, in);
  }
  elements += linear(256, 256);  // the head (256 byte tokens)
  EXPECT_NEAR(b.casts, 2 * (elements / 1e9 + 12 * added / hw.memory_bandwidth), 1e-12);  // two micro-batches
  EXPECT_NEAR(b.step, b.compute + b.casts + b.optimizer, 1e-12);
  // FP8 keeps the first and last block and the head in bf16; the four middle blocks cast at the FP8
  // rate (inputs, weights and output gradients; outputs are rounded to bf16).
  const config::RunConfig fp8 = tiny({"precision.recipe=fp8_delayed"});
  const TimeBreakdown f = plan_time(fp8, plan_memory(fp8, {.tp = 1, .dp = 1, .pp = 1}), hw);
  double middle_casts = 0.0;
  for (const auto& [out, in] : kTinyLinears) middle_casts += 4 * (n * (2 * in + out) + 2 * out * in);
  EXPECT_NEAR(f.casts, b.casts + 2 * (middle_casts / 0.25e9 - middle_casts / 1e9), 1e-12);
  // On a GPU each weight is cast once per step and form, and at ZeRO 0 a bf16 weight not at all
  // (the optimizer's bf16 copy of the parameters serves it); per-tensor FP8 casts the input and the output
  // gradient, and the weight, once each into both orientations (10 bytes per element where a cast
  // moves 9). The head's logits stay bf16 there (Transformer::bf16_logits): neither widened nor
  // their gradient cast; so does the MLP's interior (Mlp::bf16_interior): the up projection's
  // output is not widened nor its gradient cast, the down projection's input not cast (forward and
  // wgrad) nor its input gradient widened; so do attention's q/k/v and output
  // (Attention::bf16_tensors): the q/k/v projection's output not widened, the output projection's
  // input not cast (forward and wgrad) nor its input gradient widened; and the norms' outputs
  // (Norm::forward's bf16 output): the q/k/v and up projections' inputs not cast (forward and wgrad).
  // And the wgrad GEMM adds into the fp32 main gradient itself: no pass of 12 bytes per weight.
  const config::RunConfig bf16_gpu = tiny({"precision.recipe=bf16", "runtime.device=cuda"});
  const TimeBreakdown bg = plan_time(bf16_gpu, plan_memory(bf16_gpu, {.tp = 1, .dp = 1, .pp = 1}), hw);
  double weights = 256 * 256;  // the head's
  for (const auto& [out, in] : kTinyLinears) weights += 6 * out * in;
  const double logits = 2 * n * 256;            // per micro-batch
  const double mlp = 6 * n * (2 * 1408 + 3 * 704);  // per micro-batch: 6 layers' up (out 1408) and down (in 704)
  const double attention = 6 * n * (512 + 3 * 256);  // per micro-batch: 6 layers' q/k/v (out 512) and o_proj (in 256)
  const double normed = 6 * n * 2 * (256 + 256);    // per micro-batch: 6 layers' q/k/v and up inputs (in 256)
  // and the q/k/v gradient (Attention::bf16_gradients): not cast, but under RoPE with a q/k/v bias.
  const double qkv_gradient = 6 * n * 512;  // per micro-batch: 6 layers' q/k/v output gradient
  // and the q/k/v and up projections' input gradients, the norms' output gradients
  // (ColumnParallelLinear::gives_bf16_input_grad): not widened.
  const double normed_gradient = 6 * n * (256 + 256);  // per micro-batch
  // and the output and down projections' output gradient (the residual stream's, 256 wide) given
  // bf16 by the norm backward that wrote it (model::ResidualGradForReader): of its cast's 6 bytes the
  // norm's 2-byte write is left.
  const double residual_gradient = 4.0 / 6.0 * 6 * n * (256 + 256);  // per micro-batch
  EXPECT_NEAR(bg.casts,
              b.casts - 2 * 2 * weights / 1e9 -
                  2 * (logits + mlp + attention + normed + qkv_gradient + normed_gradient + residual_gradient) / 1e9 -
                  2 * 12 * added / hw.memory_bandwidth,
              1e-12);
  const config::RunConfig learned = tiny({"precision.recipe=bf16", "runtime.device=cuda", "model.positions=learned"});
  EXPECT_NEAR(plan_time(learned, plan_memory(learned, {.tp = 1, .dp = 1, .pp = 1}), hw).casts, bg.casts, 1e-12);
  const config::RunConfig biased = tiny({"precision.recipe=bf16", "runtime.device=cuda", "model.bias=true"});
  EXPECT_NEAR(plan_time(biased, plan_memory(biased, {.tp = 1, .dp = 1, .pp = 1}), hw).casts,
              bg.casts + 2 * qkv_gradient / 1e9, 1e-12);
  const config::RunConfig fp8_gpu = tiny({"precision.recipe=fp8_current", "runtime.device=cuda"});
  const TimeBreakdown fg = plan_time(fp8_gpu, plan_memory(fp8_gpu, {.tp = 1, .dp = 1, .pp = 1}), hw);
  // The four FP8 blocks: their casts in FP8 less what bf16 cast of them (no weight); the weight's
  // cast (once per step: half per micro-batch) reads it once, its amax taken by the optimizer's pass
  // (ZeRO 0: parallel::keeps_fp8_weight_casts), 6 bytes of the 10.
  double middle = 0.0;
  for (const auto& [out, in] : kTinyLinears) {
    middle += 4 * ((10.0 / 9.0 * n * (in + out) + 6.0 / 9.0 * 0.5 * out * in) / 0.25e9 - n * (2 * in + out) / 1e9);
  }
  // and, in bf16, their MLPs' interior, attention tensors, norms' outputs and q/k/v gradient (512)
  // did not cost; in FP8
  // the MLP keeps its GEMMs' bf16 outputs (Mlp::bf16_hidden): the up projection's output and the
  // down projection's input gradient are not widened; and attention its tensors
  // (Attention::bf16_tensors): the q/k/v output and the output projection's input gradient are not
  // widened, and that projection casts its input's codes from bf16 (4 bytes fewer of a cast's 9)
  middle += 4 * n * (2 * 1408 + 3 * 704 + 512 + 3 * 256 + 2 * (256 + 256) + 512 - 1408 - 704 - 512 - 256) / 1e9;
  // (and the residual gradient's bf16 cast that bf16 left to the norms; FP8 casts it into codes)
  middle += 4 * 4.0 / 6.0 * n * (256 + 256) / 1e9;
  middle -= 4 * 4.0 / 9.0 * n * 256 / 0.25e9;
  // and the activation's kernels take the amaxes of the down projection's input (704) and the up
  // projection's output gradient (1408): their casts read them once (6 bytes of the 10)
  middle -= 4 * 4.0 / 9.0 * n * (704 + 1408) / 0.25e9;
  // and, without biases, they write the up projection's output-gradient codes themselves: 1 byte
  // per element beyond the SwiGLU backward's own pass (Mlp::fp8_codes_from_activation), not 6
  middle -= 4 * 5.0 / 9.0 * n * 1408 / 0.25e9;
  // and the norms write the q/k/v and up projections' input codes themselves, their statistics
  // pass taking the amax (Norm::forward_codes): those casts read the norm's input once (6 bytes)
  middle -= 4 * 4.0 / 9.0 * n * (256 + 256) / 0.25e9;
  // and the kernels writing the output gradients take their amaxes (ResidualGradForReader): the
  // norm backwards the output and down projections' (the residual stream's, 256 each), attention's
  // backward the q/k/v projection's (512): those casts read them once (6 bytes of the 10)
  middle -= 4 * 4.0 / 9.0 * n * (256 + 256 + 512) / 0.25e9;
  EXPECT_NEAR(fg.casts, bg.casts + 2 * middle, 1e-12);
  // fp8_delayed's casts take their operands' amaxes as they read them (the scale is known before),
  // and the optimizer's pass writes the weights' codes (2 of the 6 bytes of fp8_current's weight
  // cast, half per micro-batch); no amax pass reads the output projection's bf16 input (2 bytes)
  // (the q/k/v and up inputs' amaxes, taken by the norms' statistics under fp8_current, and the
  // output gradients', taken by the kernels writing them, are taken by their codes' pass); and the
  // activation's amax-only
  // passes before its codes go (the down projection's input: SwiGLU's 4 bytes of [gate | up] per
  // activation element; the up projection's output gradient: 3 bytes per hidden element).
  const config::RunConfig delayed_gpu = tiny({"precision.recipe=fp8_delayed", "runtime.device=cuda"});
  const double delayed = plan_time(delayed_gpu, plan_memory(delayed_gpu, {.tp = 1, .dp = 1, .pp = 1}), hw).casts;
  double block_weights = 0.0;
  for (const auto& [out, in] : kTinyLinears) block_weights += out * in;
  const double saved =
      4.0 / 9.0 * 0.5 * block_weights + 2.0 / 9.0 * n * 256 + 4.0 / 9.0 * n * 704 + 3.0 / 9.0 * n * 1408;
  EXPECT_NEAR(delayed, fg.casts - 2 * 4 * saved / 0.25e9, 1e-12);
}

// FP8 linears at the device's FP8 rate: the four middle blocks' linears (the first and last block
// and the head stay bf16) at twice the rate take half their time; MXFP8 (bf16 products on
// Hopper) and a device without an FP8 rate (the CPU's emulation) gain nothing.
TEST(TimePlan, Fp8LinearsRunAtTheFp8Rate) {
  Hardware hw = device();  // 1 TFLOP/s
  const auto compute = [&](const std::string& recipe, const std::vector<std::string>& more = {}) {
    std::vector<std::string> overrides = {"precision.recipe=" + recipe};
    overrides.insert(overrides.end(), more.begin(), more.end());
    const config::RunConfig run = tiny(overrides);
    return plan_time(run, plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}), hw).compute;
  };
  const double bf16 = compute("bf16");
  EXPECT_DOUBLE_EQ(compute("fp8_current"), bf16);  // no FP8 rate: no gain
  hw.fp8_peak_flops = 2e12;
  double weights = 0.0;
  for (const auto& [out, in] : kTinyLinears) weights += out * in;
  const double tokens = 2 * 4 * 128;                        // two micro-batches of 4 x 128
  const double saved = tokens * 4 * 6 * weights / 2e12;     // half of the middle blocks' linear time
  EXPECT_NEAR(compute("fp8_current"), bf16 - saved, 1e-12);
  EXPECT_NEAR(compute("fp8_blockwise"), bf16 - saved, 1e-12);
  EXPECT_NEAR(compute("fp8_current", {"precision.fp8_edge_layers_bf16=false"}), bf16 - 1.5 * saved, 1e-12);
  EXPECT_DOUBLE_EQ(compute("mxfp8"), bf16);
  hw.fp8_gemm_efficiency = 0.5;  // twice the peak at half the efficiency: the bf16 rate
  EXPECT_NEAR(compute("fp8_current"), bf16, 1e-12);
  hw.fp8_gemm_efficiency = 0.0;
  // Recompute runs the blocks' forward again, at the same rates.
  EXPECT_NEAR(compute("fp8_current", {"model.recompute=true"}), compute("bf16", {"model.recompute=true"}) - 4.0 / 3.0 * saved,
              1e-12);
}

// A hybrid's other linears: a Mamba-2 mixer's in and out projections and a MoE layer's shared and
// routed experts run at the FP8 rate under an FP8 recipe, as a dense MLP's do (the routed experts
// over their rows), and their casts are counted over their rows.
TEST(TimePlan, MambaMixersAndExpertsRunAtTheFp8RateAndAreCastOverTheirRows) {
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 4, layer_pattern: '*MEM', heads: 2, ffn_size: 32, tied_embeddings: false,
        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8, moe_shared_ffn_size: 8,
        mamba: {state_size: 4, heads: 2, head_dim: 8, groups: 1, conv_kernel: 4, chunk_size: 4}}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";
  Hardware hw = device();  // 1 TFLOP/s
  hw.fp8_peak_flops = 2e12;
  hw.bf16_cast_rate = 1e9;
  const auto time = [&](const std::string& recipe) {
    const config::RunConfig run = config::parse_config(yaml, "hybrid", {"precision.recipe=" + recipe});
    return plan_time(run, plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}), hw);
  };
  // Layers 1 and 2 run FP8 (0 and 3 are the bf16 edge blocks): the mixer's in_proj 42 x 16 and
  // out_proj 16 x 16, the shared expert's gate/up 16 x 16 and down 16 x 8, and the routed experts'
  // gate/up 16 x 16 and down 16 x 8 over top 2 rows per token.
  const double tokens = 16, fp8_weights = 42 * 16 + 16 * 16 + 2 * 8 * 16 + 16 * 8 + 2 * (16 * 16 + 16 * 8);
  // And FP8 pads each expert's rows to 16 (planned at the bound: 15 rows more per expert), which
  // keeps their hidden (16) and activation (8) at the elementwise rate (a third of the bandwidth)
  // and multiplies them through both projections' three GEMMs at the FP8 rate.
  const double padding = 4 * 15 * (16 + 8) * 4 / (1e15 / 3) + 4 * 15 * 6 * (16 * 16 + 16 * 8) / 2e12;
  EXPECT_NEAR(time("fp8_current").compute,
              time("bf16").compute - tokens * 6 * fp8_weights / 2 / 1e12 + padding, 1e-15);
  // Under bf16 on the CPU each linear casts its input twice, its weight twice and its output
  // gradient once, rounds its output and input gradient, and adds its weight gradient into the
  // fp32 one (12 bytes per weight); the routed experts over their 8 rows each (16 tokens x top 2
  // over 4 experts), the others over 16.
  double elements = 0.0, added = 0.0;
  auto linear = [&](double n, double out, double in) {
    added += out * in;
    elements += n * (2 * in + out) + 2 * out * in + n * (out + in);
  };
  linear(16, 48, 16);  // q/k/v (2 heads and 2 kv heads of 8)
  linear(16, 16, 16);  // attention's output
  for (int mixer = 0; mixer < 2; ++mixer) {
    linear(16, 42, 16);
    linear(16, 16, 16);
  }
  linear(16, 16, 16);  // the shared expert's gate and up
  linear(16, 16, 8);   // and down
  for (int expert = 0; expert < 4; ++expert) {
    linear(8, 16, 16);
    linear(8, 16, 8);
  }
  linear(16, 16, 16);  // the head
  EXPECT_NEAR(time("bf16").casts, elements / 1e9 + 12 * added / hw.memory_bandwidth, 1e-15);
  EXPECT_EQ(time("fp32").casts, 0.0);
}

// The Mamba-2 mixers' scans at the scan kernels' rate (device.scan_tflops; without it half the
// GEMM rate: they compute in double), everything else as before: plans on files that differ in
// that rate alone differ by the scans' FLOPs over each rate.
TEST(TimePlan, MambaScansRunAtTheScanKernelsRate) {
  const std::string yaml = R"(
model: {vocab_size: 16, d_model: 16, layers: 4, layer_pattern: '*MEM', heads: 2, ffn_size: 32, tied_embeddings: false,
        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8,
        mamba: {state_size: 4, heads: 2, head_dim: 8, groups: 1, conv_kernel: 4, chunk_size: 4}}
data: {seq_len: 8}
train: {global_batch: 4, micro_batch: 2}
)";
  const config::RunConfig run = config::parse_config(yaml, "hybrid", {});
  const std::vector<model::LayerSpec> specs = model::resolve_layers(run.model);
  // Per token, forward: C . B over the mean prefix (4 + 1) / 2 of a block of 4, 2 x G N = 8 a
  // position; the weighted x over it, 2 x H P = 32; the state's read and update, 4 x H P N = 256.
  EXPECT_DOUBLE_EQ(model::ssd_scan_training_flops_per_token(run.model, specs[1], 8), 3.0 * (8 * 2.5 + 32 * 2.5 + 256));
  EXPECT_EQ(model::ssd_scan_training_flops_per_token(run.model, specs[0], 8), 0.0);  // attention
  const double scans = 2 * 3.0 * (8 * 2.5 + 32 * 2.5 + 256) * 16;  // two mixers, a micro-batch of 16 tokens
  Hardware hw = device();  // 1 TFLOP/s
  const auto compute = [&](double scan_tflops) {
    hw.scan_flops = scan_tflops * 1e12;
    return plan_time(run, plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}), hw).compute;
  };
  const double half_rate = compute(0.0);  // 0.5 TFLOP/s
  EXPECT_NEAR(compute(0.01) - half_rate, 2 * scans * (1 / 0.01e12 - 1 / 0.5e12), 1e-15);  // two micro-batches
  EXPECT_NEAR(compute(1.0) - half_rate, 2 * scans * (1 / 1e12 - 1 / 0.5e12), 1e-15);
}

// A small hybrid with one multi-token prediction depth: attention, a Mamba-2 mixer, a latent MoE
// layer with a shared expert, a mixer; the depth's block is attention and the MoE.
const char* const kHybridWithMtp = R"(
model: {vocab_size: 16, d_model: 16, layers: 4, layer_pattern: '*MEM', heads: 2, ffn_size: 32, tied_embeddings: false,
        moe_experts: 4, moe_top_k: 2, moe_ffn_size: 8, moe_latent_size: 8, moe_shared_ffn_size: 8, mtp_depths: 1,
        mamba: {state_size: 4, heads: 2, head_dim: 8, groups: 2, conv_kernel: 4, chunk_size: 4}}
data: {seq_len: 8}
train: {global_batch: 2, micro_batch: 2}
)";

// Tensor parallelism over a hybrid, collective by collective (one micro-batch of 16 tokens; the
// residual stream's rows 16 x 16 x 4 bytes: fp32, as the model sends them on any device). Without
// sequence parallelism each region from a column- to a row-parallel linear all-reduces them once
// forward and once backward: attention, each Mamba-2 mixer, the MoE layer's shared expert, and
// the depth's attention and shared expert; the two routed parts (each rank runs its share of the
// tokens) all-gather their shares' outputs forward and input gradients backward (each row is one
// rank's). The two lookups (the embedding and the depth's) all-reduce forward, the two heads
// backward. The MoE layers' router, latent projections and experts, which
// each rank differentiates over its share, have their gradients summed (fp32, after their unit).
TEST(TimePlan, HybridTensorParallelCommunicationIsCountedCollectiveByCollective) {
  const Hardware hw = device();
  const Link& link = hw.link(comm::LinkClass::SameNode);
  const auto plan = [&](std::vector<std::string> overrides) {
    // Every collective waited for (the overlap's share: tensor_parallel_time_test.cpp).
    overrides.push_back("parallel.overlap_tp_comm=false");
    const config::RunConfig run = config::parse_config(kHybridWithMtp, "hybrid", overrides);
    const MemoryPlan memory = plan_memory(run, {.tp = 2, .dp = 1, .pp = 1});
    return std::pair{memory.stages[0], plan_time(run, memory, hw)};
  };
  const double stream = 16 * 16 * 4;
  const double reduce = all_reduce_seconds(stream, 2, link), gather = all_gather_seconds(stream, 2, link);
  const auto [plain, t] = plan({"parallel.tp=2"});
  const int64_t moe_sums = 64 + 256 + 768;  // router 4 x 16, latent 2 x 8 x 16, experts 4 x 3 x 8 x 8
  EXPECT_EQ(plain.tp_gradient_sums, (std::vector<int64_t>{moe_sums, moe_sums}));  // kv heads split: nothing else
  EXPECT_NEAR(t.tp_comm, (6 + 2 + 6 + 2) * reduce + (2 + 2) * gather + 2 * all_reduce_seconds(4.0 * moe_sums, 2, link),
              1e-15);
  // Sequence parallelism: each region gathers its input and reduce-scatters its output forward;
  // backward it gathers the output's gradient, gathers its input again for the weight gradient
  // (no FP8 codes kept on the CPU) and reduce-scatters the input's gradient. Each MoE layer's routed
  // part gathers its input rows forward (its input gradient is its own rows'); each lookup
  // reduce-scatters forward and gathers backward, each head the other way round; eh_proj gathers
  // its [enorm | hnorm] rows (32 wide) forward and its output's gradient backward.
  const auto [split, s] = plan({"parallel.tp=2", "parallel.sequence_parallel=true"});
  // Then the gradients every rank holds whole but computes over its own rows are summed after
  // each unit's backward (fp32): the layers' norms (16 each), the MoE layers' router (4 x 16),
  // latent projections (2 x 8 x 16) and experts (4 x 3 x 8 x 8); the head's unit the final norm,
  // the depth's enorm, hnorm and final_layernorm and its block's two norms, router, latent
  // projections and experts.
  const std::vector<int64_t> sums = {16, 16, 16 + 64 + 256 + 768, 16, 4 * 16 + 2 * 16 + 64 + 256 + 768};
  EXPECT_EQ(split.tp_gradient_sums, sums);
  double summed = 0.0;
  for (const int64_t n : sums) summed += all_reduce_seconds(4.0 * n, 2, link);
  const double regions = 6 * (2 + 3) * gather, routed = 2 * gather, ends = 4 * 2 * gather;
  const double eh_proj = all_gather_seconds(2 * stream, 2, link) + gather;
  EXPECT_NEAR(s.tp_comm, regions + routed + ends + eh_proj + summed, 1e-15);
  // Recompute runs the blocks' forwards, and their collectives, again.
  const auto [again, r] = plan({"parallel.tp=2", "parallel.sequence_parallel=true", "model.recompute=true"});
  EXPECT_NEAR(r.tp_comm - s.tp_comm, 6 * 2 * gather + routed, 1e-15);
}

// The multi-token prediction depth's block is costed as the layers' blocks are: its linears under
// the last layer's recipe (bf16 with the FP8 edge layers, else FP8 at the FP8 rate) and their
// casts; its eh_proj in fp32 with no cast. At tp 2 each rank computes half of the FP8 linears.
TEST(TimePlan, MultiTokenPredictionBlocksAreCostedAsTheLayersBlocks) {
  Hardware hw = device();  // 1 TFLOP/s
  hw.fp8_peak_flops = 2e12;
  hw.bf16_cast_rate = 1e9;
  const auto time = [&](const std::string& recipe, const std::vector<std::string>& more = {}, int tp = 1) {
    std::vector<std::string> overrides = {"precision.recipe=" + recipe, "parallel.tp=" + std::to_string(tp)};
    overrides.insert(overrides.end(), more.begin(), more.end());
    const config::RunConfig run = config::parse_config(kHybridWithMtp, "hybrid", overrides);
    return plan_time(run, plan_memory(run, {.tp = tp, .dp = 1, .pp = 1}), hw);
  };
  // Layers 1 and 2: the mixer's in_proj 50 x 16 (z, x 16 each, B, C 2 x 4 each, dt 2) and out_proj
  // 16 x 16, the shared expert's gate/up 16 x 16 and down 16 x 8, and the routed experts' gate/up
  // 16 x 8 and down 8 x 8 at the latent width over top 2 rows per token; the edges (and the
  // depth's block, under the last layer's recipe) bf16 unless fp8_edge_layers_bf16 is off.
  const double tokens = 16, experts = 2 * (16 * 8 + 8 * 8), middle = 50 * 16 + 16 * 16 + 2 * 8 * 16 + 16 * 8;
  const double edges = 48 * 16 + 16 * 16 + 50 * 16 + 16 * 16, depth = 48 * 16 + 16 * 16 + 2 * 8 * 16 + 16 * 8;
  const auto saved = [&](double weights) { return tokens * 6 * weights / 2 / 1e12; };
  // Each FP8 MoE layer's padded expert rows (as the test above counts them: their activations,
  // and their products at the FP8 rate).
  const double padding = 4 * 15 * (16 + 8) * 4 / (1e15 / 3) + 4 * 15 * 6 * (16 * 8 + 8 * 8) / 2e12;
  EXPECT_NEAR(time("fp8_current").compute, time("bf16").compute - saved(middle + experts) + padding, 1e-15);
  const std::vector<std::string> all_fp8 = {"precision.fp8_edge_layers_bf16=false"};
  EXPECT_NEAR(time("fp8_current", all_fp8).compute,
              time("bf16", all_fp8).compute - saved(middle + edges + depth + 2 * experts) + 2 * padding, 1e-15);
  // At tp 2 each rank computes half of the split linears and of the routed experts' rows (its
  // share of the tokens: TensorParallelTime counts the rest by hand).
  EXPECT_NEAR(time("fp8_current", all_fp8, 2).compute,
              time("bf16", all_fp8, 2).compute - saved((middle + edges + depth + 2 * experts) / 2) + 2 * padding,
              1e-15);
  // bf16 casts on the CPU (as MambaMixersAndExpertsRunAtTheFp8RateAndAreCastOverTheirRows
  // counts them): the layers', the depth block's attention, shared expert, latent projections and
  // routed experts, and the head; eh_proj (fp32) none.
  double elements = 0.0, added = 0.0;
  auto linear = [&](double n, double out, double in) {
    added += out * in;
    elements += n * (2 * in + out) + 2 * out * in + n * (out + in);
  };
  for (int block = 0; block < 2; ++block) {  // layer 0, and the depth's block
    linear(16, 48, 16);
    linear(16, 16, 16);
  }
  for (int mixer = 0; mixer < 2; ++mixer) {
    linear(16, 50, 16);
    linear(16, 16, 16);
  }
  for (int moe = 0; moe < 2; ++moe) {  // layer 2, and the depth's block
    linear(16, 16, 16);
    linear(16, 16, 8);
    linear(16, 8, 16);  // the latent projections (bf16 under any recipe but fp32)
    linear(16, 16, 8);
    for (int expert = 0; expert < 4; ++expert) {
      linear(8, 16, 8);  // the experts' gate/up 16 x 8 and down 8 x 8 at the latent width
      linear(8, 8, 8);
    }
  }
  linear(16, 16, 16);  // the head
  EXPECT_NEAR(time("bf16").casts, elements / 1e9 + 12 * added / hw.memory_bandwidth, 1e-15);
}

// A GPU's GEMMs write their outputs after their products (gemm_writes_output), at the memory
// bandwidth: per micro-batch each linear's forward output and dgrad's input gradient (4 bytes in
// fp32, 2 where a GPU leaves them bf16) and wgrad's fp32 main gradient, read and added to (8),
// the head's too; a recompute writes the blocks' forward outputs again.
TEST(TimePlan, GemmsThatWriteTheirOutputsAfterTheProductsAddThoseBytesAtTheBandwidth) {
  Hardware hw = device();
  hw.memory_bandwidth = 1e9;
  const auto compute = [&](const std::vector<std::string>& overrides) {
    const config::RunConfig run = tiny(overrides);
    return plan_time(run, plan_memory(run, {.tp = 1, .dp = 1, .pp = 1}), hw).compute;
  };
  const double n = 4 * 128;  // rows of a micro-batch; two micro-batches per step
  double weights = 0.0, outs = 0.0, ins = 0.0;
  for (const auto& [out, in] : kTinyLinears) {
    weights += 6 * out * in;
    outs += 6 * n * out;
    ins += 6 * n * in;
  }
  const double head_forward = n * 256 * 4, head_backward = n * 256 * 4 + 8 * 256 * 256;
  const std::vector<std::string> fp32 = {}, recompute = {"model.recompute=true"};
  const double hidden = compute(fp32), hidden_recompute = compute(recompute);
  hw.gemm_writes_output = true;
  // The blocks' weight gradients: written whole by the first micro-batch's wgrad (4 bytes), read
  // and added into by the second's (8); the head's (the tied embedding's) added into by both.
  const double written = 4 * outs + head_forward + 4 * ins + 6 * weights + head_backward;
  EXPECT_NEAR(compute(fp32), hidden + 2 * written / 1e9, 1e-12);
  EXPECT_NEAR(compute(recompute), hidden_recompute + 2 * (written + 4 * outs) / 1e9, 1e-12);
  // bf16 on a GPU: q/k/v's and the up projection's outputs, every projection's input gradient (the
  // q/k/v and up projections': the norms' output gradients, at one tensor-parallel rank) and the
  // logits are bf16 (2 bytes).
  const std::vector<std::string> bf16 = {"precision.recipe=bf16", "runtime.device=cuda"};
  hw.gemm_writes_output = false;
  const double bf16_hidden = compute(bf16);
  hw.gemm_writes_output = true;
  const double halved = 6 * n * (512 + 1408) * 2 + n * 256 * 2 + 6 * n * (256 + 704 + 256 + 256) * 2;
  EXPECT_NEAR(compute(bf16), bf16_hidden + 2 * (written - halved) / 1e9, 1e-12);
}

// AdamW's 32 bytes per owned parameter, then the zeroing of the gradients for the next step: 4
// bytes per parameter the rank holds but the blocks' linear weights', which their first wgrad
// writes whole; all of them under ZeRO-3, which zeroes its sections itself.
TEST(TimePlan, TheOptimizerZeroesEveryGradientButTheBlocksWeights) {
  Hardware hw = device();
  hw.memory_bandwidth = 1e9;
  const double block_weights = tiny_block_weights();
  for (const int zero : {0, 1, 2, 3}) {
    const int dp = zero == 0 ? 1 : 2;
    const config::RunConfig c = tiny({"parallel.zero=" + std::to_string(zero)});
    const MemoryPlan m = plan_memory(c, {.tp = 1, .dp = dp, .pp = 1});
    const double params = static_cast<double>(m.stages[0].parameter_count), owned = zero == 0 ? params : params / 2;
    const double zeroed = zero == 3 ? params : params - block_weights;
    EXPECT_NEAR(plan_time(c, m, hw).optimizer, (32 * owned + 4 * zeroed) / 1e9, 1e-12) << "zero " << zero;
  }
}

// optim.cpu_offload on a GPU: for the offloaded share (optim.offload_fraction) the device reads
// each owned gradient for the norm (4 bytes), the host link carries 12 bytes per parameter and the
// host's memory 28; the rest costs the device's 32; zeroing as before. That share's moments (8
// bytes per owned parameter) leave the device's memory for the host's.
TEST(TimePlan, AnOffloadedOptimizerCostsTheHostLinkAndHostMemory) {
  const Hardware hw = offload_device();
  const double block_weights = tiny_block_weights();
  for (const double fraction : {1.0, 0.25}) {
    for (const int zero : {0, 1}) {
      SCOPED_TRACE("zero " + std::to_string(zero) + ", fraction " + std::to_string(fraction));
      const int dp = zero == 0 ? 1 : 2;
      const std::vector<std::string> gpu = {"parallel.zero=" + std::to_string(zero), "runtime.device=cuda"};
      std::vector<std::string> offloaded = gpu;
      offloaded.insert(offloaded.end(),
                       {"optim.cpu_offload=true", "optim.offload_fraction=" + std::to_string(fraction)});
      const config::RunConfig on_device = tiny(gpu), on_host = tiny(offloaded);
      const MemoryPlan m = plan_memory(on_host, {.tp = 1, .dp = dp, .pp = 1});
      const MemoryPlan reference = plan_memory(on_device, {.tp = 1, .dp = dp, .pp = 1});
      const double params = static_cast<double>(m.stages[0].parameter_count);
      const double owned = zero == 0 ? params : params / 2, host = fraction * owned;
      const double zeroed = params - block_weights;
      const double expected =
          (4 * host + 32 * (owned - host) + 4 * zeroed) / 1e9 + 12 * host / 2e8 + 28 * host / 5e8;
      EXPECT_NEAR(plan_time(on_host, m, hw).optimizer, expected, 1e-12);
      const parallel::MemoryBytes& state = m.stages[0].state;
      EXPECT_EQ(state.optimizer_moments + state.host_optimizer_moments, reference.stages[0].state.optimizer_moments);
      EXPECT_NEAR(static_cast<double>(state.host_optimizer_moments), 8 * host, 8.0 * dp);
      EXPECT_EQ(m.stages[0].total(), reference.stages[0].total() - state.host_optimizer_moments);
    }
  }
}

// The offloaded update goes in chunks of 16 Mi elements, pipelined: while the host updates one,
// the link carries the next one down and the previous one up. A model of about 100M parameters
// (7 chunks) at one rank: the link's 12 bytes and the host memory's 28 per parameter no longer
// add up, the longer counts whole and the shorter a chunk's share; the tiny model (one chunk)
// pays both whole, as the test above says.
TEST(TimePlan, AnOffloadedUpdateOverlapsTheLinkWithTheHostChunkByChunk) {
  const config::RunConfig c = tiny({"model.d_model=1024", "model.ffn_size=4096", "model.kv_heads=8",
                                    "runtime.device=cuda", "optim.cpu_offload=true"});
  const MemoryPlan m = plan_memory(c, {.tp = 1, .dp = 1, .pp = 1});
  const double params = static_cast<double>(m.stages[0].parameter_count);
  const double chunks = std::ceil(params / static_cast<double>(int64_t{16} << 20));
  ASSERT_EQ(chunks, 7.0);
  const Hardware hw = offload_device();
  Hardware free_host = hw;  // what the device alone costs
  free_host.host_link_bandwidth = free_host.host_memory_bandwidth = 1e30;
  const double link = 12 * params / 2e8, host = 28 * params / 5e8;
  EXPECT_NEAR(plan_time(c, m, hw).optimizer - plan_time(c, m, free_host).optimizer,
              std::max(link, host) + std::min(link, host) / chunks, 1e-9);
}

// parallel.offload_params: ZeRO-3's parameter and gradient shards (and master weights) move to the
// host's memory, the device keeping two sections' shards for their gathers; each micro-batch the
// link carries every owned parameter down twice (its gathers, 4 bytes each) and its reduced
// gradient up (4), which the host adds into the gradient shard (12 bytes of host memory); the
// update reads its gradients in host memory (the norm's 4 bytes there too) and needs no link.
TEST(TimePlan, ShardsInHostMemoryCostTheLinkEachMicroBatch) {
  const Hardware hw = offload_device();
  for (const int dp : {1, 2}) {
    SCOPED_TRACE("dp " + std::to_string(dp));
    const std::vector<std::string> moments = {"parallel.zero=3", "runtime.device=cuda", "optim.cpu_offload=true"};
    std::vector<std::string> shards = moments;
    shards.push_back("parallel.offload_params=true");
    const config::RunConfig reference_config = tiny(moments), c = tiny(shards);
    const MemoryPlan m = plan_memory(c, {.tp = 1, .dp = dp, .pp = 1});
    const MemoryPlan reference = plan_memory(reference_config, {.tp = 1, .dp = dp, .pp = 1});
    const parallel::MemoryBytes& state = m.stages[0].state;
    EXPECT_EQ(state.parameters + state.master_weights + state.gradients, 0);
    EXPECT_GT(state.host_parameters, 0);
    EXPECT_EQ(state.host_parameters, dp == 1 ? 4 * m.stages[0].parameter_count
                                             : reference.stages[0].state.parameters +
                                                   reference.stages[0].state.master_weights);
    EXPECT_EQ(state.host_gradients, state.host_parameters);  // fp32 shards of the same padded size
    const int64_t gathered = m.stages[0].gather_buffers - reference.stages[0].gather_buffers;
    if (dp == 2) {
      EXPECT_GT(gathered, 0);
      EXPECT_LT(gathered, 2 * 4 * m.stages[0].parameter_count / dp);
    }

    const double params = static_cast<double>(m.stages[0].parameter_count), owned = params / dp;
    const double micro_batches = m.layout.micro_batches;
    const TimeBreakdown t = plan_time(c, m, hw);
    EXPECT_NEAR(t.host_link, micro_batches * owned * ((2 * 4 + 4) / 2e8 + (8 + 4) / 5e8), 1e-12);
    // ZeRO-3 zeroes its sections itself, at one rank too: no gradient is written whole.
    EXPECT_NEAR(t.optimizer, 4 * params / 1e9 + (28 + 4) * owned / 5e8, 1e-12);
    const TimeBreakdown before = plan_time(reference_config, reference, hw);
    EXPECT_NEAR(t.step, before.step - before.optimizer + t.optimizer + t.host_link, 1e-9) << "nothing else changes";
  }
}

// parallel.offload_params_device_copy: the device keeps the owned shard as the gathers send it
// (fp32: 4 bytes per owned parameter, bf16 gathers 2) instead of two sections' copies, and the link
// carries it down once a step instead of twice a micro-batch; the gradients still go up each
// micro-batch.
TEST(TimePlan, ADeviceCopyOfTheShardsCrossesTheLinkOnceAStep) {
  const Hardware hw = offload_device();
  for (const bool compact : {false, true}) {
    SCOPED_TRACE(compact ? "bf16 gathers" : "fp32 gathers");
    std::vector<std::string> shards = {"parallel.zero=3", "runtime.device=cuda", "optim.cpu_offload=true",
                                       "parallel.offload_params=true"};
    if (compact) shards.insert(shards.end(), {"precision.recipe=bf16", "precision.param_dtype=compute"});
    std::vector<std::string> copied = shards;
    copied.push_back("parallel.offload_params_device_copy=true");
    const config::RunConfig without = tiny(shards), with = tiny(copied);
    const int dp = 2;
    const MemoryPlan m = plan_memory(with, {.tp = 1, .dp = dp, .pp = 1});
    const MemoryPlan reference = plan_memory(without, {.tp = 1, .dp = dp, .pp = 1});
    const int64_t params = m.stages[0].parameter_count, owned = (params + dp - 1) / dp;
    const int64_t gathered = compact ? 2 : 4;
    const parallel::MemoryBytes& state = m.stages[0].state;
    EXPECT_EQ(state.parameters, gathered * owned);
    EXPECT_EQ(state.host_parameters, reference.stages[0].state.host_parameters) << "the shards stay on the host";
    EXPECT_EQ(state.host_gradients, reference.stages[0].state.host_gradients);
    EXPECT_LT(m.stages[0].gather_buffers, reference.stages[0].gather_buffers) << "no section's copy for its gather";

    const double micro_batches = m.layout.micro_batches;
    const double own = static_cast<double>(params) / dp, down = static_cast<double>(gathered);
    const TimeBreakdown t = plan_time(with, m, hw), before = plan_time(without, reference, hw);
    EXPECT_NEAR(t.host_link, micro_batches * own * (4 / 2e8 + (8 + 4) / 5e8) + own * down / 2e8, 1e-12);
    EXPECT_NEAR(before.host_link - t.host_link, (2 * micro_batches - 1) * own * down / 2e8, 1e-12);
  }
}

// Memory handed back between uses: ZeRO-2's gradients (4 bytes a parameter per micro-batch),
// ZeRO-3's parameters after forward and backward and its gradients (12 bytes), compact
// parameters widened twice (8 bytes, plus two casts of every parameter).
TEST(TimePlan, HandedBackMemoryCostsItsFaults) {
  Hardware hw = device();
  hw.fresh_memory_bandwidth = 1e9;
  hw.bf16_cast_rate = 4e9;
  auto memory_s = [&](const std::vector<std::string>& overrides, int dp) {
    const config::RunConfig c = tiny(overrides);
    const MemoryPlan m = plan_memory(c, {.tp = 1, .dp = dp, .pp = 1});
    return std::pair{plan_time(c, m, hw).memory, static_cast<double>(m.stages[0].parameter_count)};
  };
  EXPECT_EQ(memory_s({"parallel.zero=1"}, 2).first, 0.0);
  const auto [zero2, params] = memory_s({"parallel.zero=2"}, 2);  // one micro-batch per rank
  EXPECT_NEAR(zero2, 4 * params / 1e9, 1e-12);
  EXPECT_NEAR(memory_s({"parallel.zero=3"}, 2).first, 12 * params / 1e9, 1e-12);
  // One rank runs ZeRO-2 too (the trainer releases its gradients after each of its two micro-batches).
  EXPECT_NEAR(memory_s({"parallel.zero=2"}, 1).first, 2 * 4 * params / 1e9, 1e-12);
  EXPECT_NEAR(memory_s({"precision.recipe=bf16", "precision.param_dtype=compute"}, 1).first,
              2 * (8 * params / 1e9 + 2 * params / 4e9), 1e-12);  // two micro-batches
}

// Four ranks on a host of two cores: a pipeline of two stages on two data-parallel ranks keeps
// both cores busy, so the step is all the work over two cores, not each rank's schedule at half
// a core (which would count the bubble twice).
TEST(TimePlan, RanksSharingCoresTakeTurns) {
  Hardware hw = device();
  hw.shared = true;
  hw.cores = 2;
  const config::RunConfig pp = tiny({"parallel.pp=2", "train.micro_batch=2"});
  const TimeBreakdown two = plan_time(pp, plan_memory(pp, {.tp = 1, .dp = 1, .pp = 2}), hw);
  EXPECT_EQ(two.core_wait, 0.0);
  const TimeBreakdown four = plan_time(pp, plan_memory(pp, {.tp = 1, .dp = 2, .pp = 2}), hw);
  const double busy = four.compute + four.casts + four.memory + four.tp_comm + four.pp_comm;
  EXPECT_GT(four.core_wait, 0.0);
  EXPECT_NEAR(busy + four.bubble + four.core_wait, 2 * busy, 1e-12);
}

// A rank's threads (train.threads, or every processor, over the ranks, as the trainer gives them)
// speed its work up by the host's measured speed-ups, in proportion between one thread and every
// processor, and keep that many cores busy.
TEST(TimePlan, ARanksThreadsSpeedItUpAndKeepTheirCoresBusy) {
  Hardware hw = device();
  hw.shared = true;
  hw.cores = 4;
  hw.processors = 4;
  hw.gemm_thread_speedup = 2.5;  // 1.5 at two threads
  hw.memory_thread_speedup = 1.9;  // 1.3 at two threads
  hw.bf16_cast_rate = 4e9;
  hw.activation_bandwidth = 1e9;
  auto plan = [&](const std::vector<std::string>& overrides, int dp) {
    std::vector<std::string> all = {"precision.recipe=bf16", "train.micro_batch=2"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    const config::RunConfig c = tiny(all);
    return plan_time(c, plan_memory(c, {.tp = 1, .dp = dp, .pp = 1}), hw);
  };
  const TimeBreakdown one = plan({"train.threads=1"}, 1), two = plan({"train.threads=2"}, 1);
  EXPECT_NEAR(two.casts, one.casts / 1.3, 1e-12);
  EXPECT_NEAR(two.optimizer, one.optimizer / 1.3, 1e-12);
  // The compute: the GEMMs 1.5x faster, the elementwise kernels 1.3x.
  EXPECT_LT(two.compute, one.compute / 1.3);
  EXPECT_GT(two.compute, one.compute / 1.5);
  hw.memory_thread_speedup = 2.5;
  const TimeBreakdown gemms = plan({"train.threads=1"}, 1), every = plan({}, 1), more = plan({"train.threads=16"}, 1);
  EXPECT_NEAR(every.compute, gemms.compute / 2.5, 1e-12);
  EXPECT_DOUBLE_EQ(more.compute, every.compute);  // no faster past the processors
  EXPECT_EQ(every.core_wait, 0.0);
  // Two ranks of two threads on the four cores: no wait; four ranks of two (train.threads 8) wait
  // for each other's cores: their work is 4 ranks x 2 threads of it over 4 cores.
  EXPECT_EQ(plan({}, 2).core_wait, 0.0);
  const TimeBreakdown crowded = plan({"train.threads=8"}, 4);
  const double busy = crowded.compute + crowded.casts + crowded.memory;
  EXPECT_NEAR(crowded.core_wait, busy, 1e-12);
  // A device's rates are its own: threads do not change them.
  hw.shared = false;
  EXPECT_DOUBLE_EQ(plan({}, 1).compute, plan({"train.threads=1"}, 1).compute);
}

// The layout rule of these searches: the model ranks (tp x cp x pp) divide the devices, the rest
// is data parallel.
LayoutCheck dividing_layouts() {
  return [](const config::RunConfig& c, int devices) {
    const int model_ranks = c.parallel.tp * c.parallel.cp * c.parallel.pp;
    LOOM_CHECK(devices % model_ranks == 0, "does not divide");
    return comm::MeshShape{.tp = c.parallel.tp, .cp = c.parallel.cp, .ep = c.parallel.ep,
                           .dp = devices / model_ranks, .pp = c.parallel.pp};
  };
}

// parallel.overlap_param_gather in the base applies to the ZeRO 1-2 layouts; the ZeRO 0 and 3 ones,
// which refuse the key, are planned without it (not refused), and their overrides say so.
TEST(Search, OverlappedParameterGathersApplyWhereTheStageHasThem) {
  const LayoutCheck check = dividing_layouts();
  const SearchResult plain = search_layouts(tiny({"parallel.zero=1"}), device(), 4, check);
  const SearchResult overlapped =
      search_layouts(tiny({"parallel.zero=1", "parallel.overlap_param_gather=true"}), device(), 4, check);
  EXPECT_EQ(overlapped.refused, plain.refused);
  ASSERT_EQ(overlapped.ranked.size(), plain.ranked.size());
  int zero03 = 0, faster = 0;
  for (const Candidate& c : overlapped.ranked) {
    const int zero = c.config.parallel.zero;
    const std::vector<std::string> o = c.overrides();
    const bool says_false = std::find(o.begin(), o.end(), "parallel.overlap_param_gather=false") != o.end();
    EXPECT_EQ(c.config.parallel.overlap_param_gather, zero == 1 || zero == 2) << c.describe();
    EXPECT_EQ(says_false, zero == 0 || zero == 3) << c.describe();
    zero03 += zero == 0 || zero == 3;
    for (const Candidate& p : plain.ranked) {
      if (p.describe() != c.describe()) continue;
      EXPECT_LE(c.time.dp_comm, p.time.dp_comm) << c.describe();
      faster += c.time.dp_comm < p.time.dp_comm;
    }
  }
  EXPECT_GT(zero03, 0);
  EXPECT_GT(faster, 0);
}

// With ZeRO-3's shards on the host the search tries each ZeRO-3 layout with and without the
// device's copy of the shards for the gathers: the copy holds more device memory and spends less
// time on the host link, and the overrides say which was planned.
TEST(Search, OffloadedShardsAreTriedWithAndWithoutTheDeviceCopy) {
  const LayoutCheck check = dividing_layouts();
  const SearchResult r = search_layouts(tiny({"runtime.device=cuda", "parallel.zero=3", "optim.cpu_offload=true",
                                              "parallel.offload_params=true"}),
                                        offload_device(), 2, check);
  int pairs = 0;
  for (const Candidate& with : r.ranked) {
    EXPECT_EQ(with.config.parallel.zero, 3) << with.describe();
    if (!with.config.parallel.offload_params_device_copy) continue;
    const std::vector<std::string> o = with.overrides();
    EXPECT_NE(std::find(o.begin(), o.end(), "parallel.offload_params_device_copy=true"), o.end());
    for (const Candidate& without : r.ranked) {
      if (without.config.parallel.offload_params_device_copy ||
          without.describe() != with.describe().substr(0, without.describe().size()) ||
          without.config.train.micro_batch != with.config.train.micro_batch) {
        continue;
      }
      const std::vector<std::string> w = without.overrides();
      EXPECT_NE(std::find(w.begin(), w.end(), "parallel.offload_params_device_copy=false"), w.end());
      EXPECT_LT(with.time.host_link, without.time.host_link) << with.describe();
      EXPECT_GT(with.memory.stages[0].state.parameters, without.memory.stages[0].state.parameters);
      ++pairs;
    }
  }
  EXPECT_GT(pairs, 0);
}

TEST(Search, RanksOnlyLayoutsTheRulesAcceptAndThatFit) {
  int checked = 0;
  const LayoutCheck check = [&](const config::RunConfig& c, int devices) {
    ++checked;
    const int model_ranks = c.parallel.tp * c.parallel.cp * c.parallel.pp;
    LOOM_CHECK(devices % model_ranks == 0, "does not divide");
    return comm::MeshShape{.tp = c.parallel.tp, .cp = c.parallel.cp, .ep = c.parallel.ep,
                           .dp = devices / model_ranks, .pp = c.parallel.pp};
  };
  const SearchResult r = search_layouts(tiny({}), device(), 2, check);
  ASSERT_FALSE(r.ranked.empty());
  EXPECT_EQ(r.enumerated, r.refused + r.too_large + static_cast<int>(r.ranked.size()));
  EXPECT_GT(checked, 0);
  // Ranked by planned time up to 2%.
  for (size_t i = 1; i < r.ranked.size(); ++i) EXPECT_LE(r.ranked[i - 1].time.step, 1.0201 * r.ranked[i].time.step);
  for (const Candidate& c : r.ranked) {
    EXPECT_LE(static_cast<double>(c.memory.peak()), device().memory_bytes);
    EXPECT_FALSE(c.config.parallel.zero == 3 && c.config.parallel.pp > 1) << c.describe();
  }
  // tp 2, cp 2, pp 2 and dp 2 are all there.
  bool tp = false, cp = false, pp = false, dp = false;
  for (const Candidate& c : r.ranked) {
    tp = tp || c.config.parallel.tp == 2;
    // ZeRO over the cp ranks too: they reduce the gradients of their own tokens.
    cp = cp || (c.config.parallel.cp == 2 && c.memory.layout.shape.cp == 2 && c.time.cp_comm > 0.0 &&
                c.config.parallel.zero == 1);
    pp = pp || c.config.parallel.pp == 2;
    dp = dp || c.memory.layout.shape.dp == 2;
  }
  EXPECT_TRUE(tp && cp && pp && dp);
  // A dense model: no expert parallelism enumerated.
  for (const Candidate& c : r.ranked) EXPECT_EQ(c.config.parallel.ep, 1) << c.describe();
  // With 4 experts, ep 2 over dp 2 is enumerated, costs its token exchanges and holds half the
  // experts; ep 4 would need 4 data- or context-parallel ranks.
  const config::RunConfig moe = tiny({"model.moe_experts=4", "model.moe_top_k=2", "model.moe_ffn_size=176"});
  const SearchResult e = search_layouts(moe, device(), 2, check);
  const Candidate* ep = nullptr;
  const Candidate* same = nullptr;
  for (const Candidate& c : e.ranked) {
    if (c.config.parallel.ep == 2 && ep == nullptr) ep = &c;
    EXPECT_LE(c.config.parallel.ep, 2) << c.describe();
  }
  ASSERT_NE(ep, nullptr);
  std::string without_ep = ep->describe();
  const size_t at = without_ep.find(", ep 2");
  ASSERT_NE(at, std::string::npos) << without_ep;
  without_ep.erase(at, 6);
  for (const Candidate& c : e.ranked) {
    if (c.describe() == without_ep) same = &c;
  }
  EXPECT_GT(ep->time.ep_comm, 0.0);
  ASSERT_NE(same, nullptr);  // the same layout without expert parallelism holds all 4 experts
  EXPECT_EQ(same->memory.stages[0].parameter_count - ep->memory.stages[0].parameter_count, 6 * 2 * 3 * 176 * 256);
  // A device too small for anything: nothing ranked, everything counted.
  Hardware tiny_device = device();
  tiny_device.memory_bytes = 1024;
  const SearchResult none = search_layouts(tiny({}), tiny_device, 2, check);
  EXPECT_TRUE(none.ranked.empty());
  EXPECT_EQ(none.too_large + none.refused, none.enumerated);
}

}  // namespace
}  // namespace loom::plan
