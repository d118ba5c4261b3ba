// Training on the emulated CUDA device with the weight cast cache (model/weight_cast_cache.h):
// every recipe, with four micro-batches per step and recomputation, equals the same run on the CPU
// bit for bit over four steps (so each step's casts see the weights the previous optimizer step
// wrote), while each weight is cast once per form per step: 1 form for the 16-bit recipes, 2 for
// the FP8 and MX ones (dgrad's transposed or column-blocked cast), the FP8 recipes' bf16 head 1;
// per-tensor FP8 makes both of its forms in one cast (the forward's read writes dgrad's codes).
// At ZeRO 0 the optimizer keeps a bf16 copy of the parameters (parallel/data/bf16_parameter_copy.h)
// that serves every bf16 cast from the second step on: no bf16 weight is cast after the first
// step. The emulated device reads a 16-bit store's bytes and fails on one that does not hold its
// weight's values as they are now, so a stale copy cannot pass. Likewise fp8_delayed's weights:
// the optimizer's pass writes their codes for the next step (model/optimizer_weight_casts.h), and
// the emulated device fails on codes that no longer hold their weight's values.
// Tensor and pipeline parallelism and ZeRO-3 too, each rank caching its own shards or stage;
// evaluation between steps and a checkpoint's resume see the weights as the last step left them.
#include "device_training.h"
#include "support/emulated_precision.h"

namespace loom::train {
namespace {

using DeviceWeightCasts = DeviceTraining;

// Sizes cuBLASLt's blockwise FP8 products take (every GEMM dimension a multiple of 128).
constexpr const char* kWide =
    "model: {vocab_size: 0, d_model: 128, layers: 2, heads: 4, kv_heads: 4, ffn_size: 128, max_seq_len: 128,\n"
    "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n";

constexpr int kSteps = 4;

// 4 micro-batches of 1 per step, recomputed blocks, FP8 in the edge blocks too.
std::vector<std::string> settings(const std::string& recipe, std::vector<std::string> more = {}) {
  more.insert(more.end(), {"precision.recipe=" + recipe, "precision.fp8_edge_layers_bf16=false",
                           "train.micro_batch=1", "model.recompute=true"});
  return more;
}

// The casts per step of a model whose blocks hold `block_linears` linear layers in all, with a
// head: 16-bit recipes and per-tensor FP8 1 per layer (FP8's two forms from one read); blockwise
// FP8 and MX 2 per block layer and 1 for the bf16 head.
int64_t casts_per_step(const std::string& recipe, int64_t block_linears) {
  const bool one_read = recipe == "bf16" || recipe == "fp16" || recipe == "fp8_delayed" || recipe == "fp8_current";
  return one_read ? block_linears + 1 : 2 * block_linears + 1;
}

// The casts of kSteps steps where the optimizer's bf16 copy (ZeRO 0: `copy`) serves the bf16
// casts from the second step on: under bf16 all of them, under the FP8 and MX recipes the head's;
// and under fp8_delayed the optimizer's codes serve the blocks' weights too.
int64_t casts_in_run(const std::string& recipe, int64_t block_linears, bool copy) {
  const int64_t per_step = casts_per_step(recipe, block_linears);
  if (!copy || recipe == "fp16") return kSteps * per_step;
  const int64_t served = recipe == "bf16" || recipe == "fp8_delayed" ? per_step : 1;
  return kSteps * per_step - (kSteps - 1) * served;
}


TEST_F(DeviceWeightCasts, EveryRecipeCastsEachWeightOncePerFormPerStepAndEqualsTheCpuBitForBit) {
  for (const std::string recipe : {"bf16", "fp16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    const bool wide = recipe == "fp8_blockwise";
    ::loom::testing::reset_emulated_weight_cast_counts();
    expect_bitwise_equal_runs(wide ? kWide : kLlama, "casts-" + recipe,
                              settings(recipe, wide ? std::vector<std::string>{"data.seq_len=128"}
                                                    : std::vector<std::string>{}));
    // 2 blocks of qkv, o, up and down projections, and the head.
    const ::loom::testing::WeightCastCounts counts = ::loom::testing::emulated_weight_cast_counts();
    EXPECT_EQ(counts.cast, casts_in_run(recipe, 8, true));
    EXPECT_GT(counts.reused, 3 * kSteps * casts_per_step(recipe, 8));  // 4 micro-batches, each block's forward twice
  }
}

// precision.fp8_weights_from_optimizer=false: fp8_delayed's forwards cast the weights each step
// again (only the bf16 head's cast is the optimizer's copy), to the same bits.
TEST_F(DeviceWeightCasts, TheOptimizersFp8CodesCanBeTurnedOff) {
  ::loom::testing::reset_emulated_weight_cast_counts();
  expect_bitwise_equal_runs(kLlama, "casts-fp8-delayed-off",
                            settings("fp8_delayed", {"precision.fp8_weights_from_optimizer=false"}));
  const int64_t per_step = casts_per_step("fp8_delayed", 8);
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, kSteps * per_step - (kSteps - 1));
}

TEST_F(DeviceWeightCasts, TensorParallelRanksCacheTheirShardsBitForBit) {
  ::loom::testing::reset_emulated_weight_cast_counts();
  expect_bitwise_equal_runs(kGpt2, "casts-tp2-bf16", settings("bf16", {"runtime.ranks=2", "parallel.tp=2"}));
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 2 * casts_in_run("bf16", 8, true));
  ::loom::testing::reset_emulated_weight_cast_counts();
  // fp8_current's scale from the whole weight's amax, all-reduced over the group when it is cast.
  expect_bitwise_equal_runs(kGpt2, "casts-tp2-fp8-current",
                            settings("fp8_current", {"runtime.ranks=2", "parallel.tp=2"}));
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 2 * casts_in_run("fp8_current", 8, true));
}

TEST_F(DeviceWeightCasts, PipelineStagesCacheTheirLayersBitForBit) {
  for (const std::string recipe : {"fp8_delayed", "mxfp8"}) {
    SCOPED_TRACE(recipe);
    ::loom::testing::reset_emulated_weight_cast_counts();
    expect_bitwise_equal_runs(
        kLlama, "casts-pp2-" + recipe,
        settings(recipe, {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"}));
    // Stage 0 holds block 0, stage 1 block 1 and the head.
    EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, casts_in_run(recipe, 8, true));
  }
}

// ZeRO-3 gathers each unit's weights for every forward and backward into the same buffers with
// the same values: a rank still casts each weight once per form per step. Evaluation between the
// steps runs outside the scope, casting the weights as they are then.
TEST_F(DeviceWeightCasts, ZeroThreeGathersCastOncePerStepAndEvaluationSeesTheNewWeights) {
  ::loom::testing::reset_emulated_weight_cast_counts();
  expect_bitwise_equal_runs(kLlama, "casts-zero3", settings("fp8_current", {"runtime.ranks=2", "parallel.zero=3"}));
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 2 * casts_in_run("fp8_current", 8, false));
  expect_bitwise_equal_runs(kGpt2, "casts-zero3-eval",
                            settings("bf16", {"runtime.ranks=2", "parallel.zero=3", "train.eval_interval=1",
                                              "data.val_prefix=" + root_ + "/data/c_train"}));
}

// A checkpoint written on the device with cached casts resumes there and on the CPU, equal to the
// run that never stopped: the loaded weights are cast afresh (the bf16 copy and the optimizer's FP8
// amaxes and codes of a resumed run are not current until its first update).
TEST_F(DeviceWeightCasts, ACheckpointResumesWithFreshCasts) {
  for (const std::string name : {"fp8_current", "bf16", "fp8_delayed"}) {
    SCOPED_TRACE(name);
    const std::vector<std::string> recipe = settings(name);
    auto with = [&](std::vector<std::string> more) {
      more.insert(more.begin(), recipe.begin(), recipe.end());
      return more;
    };
    const std::vector<double> full = train("casts-ckpt-full-" + name, kLlama, recipe);
    train("casts-ckpt-resumed-" + name, kLlama, with({"runtime.device=cuda"}), 2);
    EXPECT_EQ(train("casts-ckpt-resumed-" + name, kLlama, with({"train.resume=true", "runtime.device=cuda"})), full);
    expect_same_checkpoints("casts-ckpt-full-" + name, "casts-ckpt-resumed-" + name);
  }
}

// DiLoCo's outer step writes the parameters after the inner update: the copy and the optimizer's
// FP8 codes are no longer current (GradientSync::parameters_changed), the next step casts, and the
// runs stay the CPU's bit for bit.
TEST_F(DeviceWeightCasts, DilocoOuterStepsLeaveNoStaleCopyBehind) {
  for (const std::string recipe : {"bf16", "fp8_delayed"}) {
    SCOPED_TRACE(recipe);
    ::loom::testing::reset_emulated_weight_cast_counts();
    expect_bitwise_equal_runs(kLlama, "casts-diloco-" + recipe,
                              settings(recipe, {"runtime.ranks=2", "parallel.dp_sites=2", "parallel.outer=diloco",
                                                "parallel.outer_steps=2"}));
    // Each rank: the first step casts, and the step after each outer step (step 3 of 4).
    EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 2 * 2 * casts_per_step(recipe, 8));
  }
}

}  // namespace
}  // namespace loom::train
