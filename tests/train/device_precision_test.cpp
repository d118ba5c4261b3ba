// The FP8 and MX recipes with runtime.device=cuda on the emulated device (its precision GEMM is
// the CPU's emulation of the recipe, fed what a GPU is fed: fp8_current's scale from the amax
// reduced on the device, fp8_delayed's scale from the host's history with the amaxes accumulated
// on the device and read once per step): each run equals the same run on the CPU bit for bit
// (losses and every tensor of the final checkpoint). The edge blocks take FP8 too
// (precision.fp8_edge_layers_bf16=false), so both blocks of the small models run it.
#include <tuple>

#include "device_training.h"
#include "support/emulated_precision.h"

namespace loom::train {
namespace {

using DevicePrecision = DeviceTraining;

std::vector<std::string> fp8(const std::string& recipe, std::vector<std::string> more = {}) {
  more.push_back("precision.recipe=" + recipe);
  more.push_back("precision.fp8_edge_layers_bf16=false");
  return more;
}

TEST_F(DevicePrecision, Fp8DelayedOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "fp8-delayed-llama", fp8("fp8_delayed"));
  expect_bitwise_equal_runs(kGpt2, "fp8-delayed-gpt2", fp8("fp8_delayed", {"precision.fp8_margin=1"}));
}

// Each block's four linears keep their input's FP8 codes from the forward (recomputed or not) for
// the weight gradient: 2 blocks x 4 linears x 2 micro-batches x 4 steps wgrads from kept codes.
// Without biases (the Llama, and GPT-2's GELU without them) the MLP's activation writes the down
// projection's input codes and the up projection's output-gradient codes itself
// (Mlp::fp8_codes_from_activation); with them (GPT-2) the fp32 tensors are cast.
TEST_F(DevicePrecision, Fp8CurrentOnTheDeviceEqualsTheCpuBitForBit) {
  for (const auto& [model, tag, more] :
       {std::tuple{kGpt2, "fp8-current-gpt2-recompute", std::vector<std::string>{"model.recompute=true"}},
        std::tuple{kGpt2, "fp8-current-gpt2-no-bias", std::vector<std::string>{"model.bias=false"}},
        std::tuple{kLlama, "fp8-current-llama", std::vector<std::string>{}},
        std::tuple{kLlama, "fp8-current-llama-recompute", std::vector<std::string>{"model.recompute=true"}}}) {
    const int64_t reuses = ::loom::testing::emulated_input_code_reuses();
    expect_bitwise_equal_runs(model, tag, fp8("fp8_current", more));
    EXPECT_EQ(::loom::testing::emulated_input_code_reuses() - reuses, 2 * 4 * 2 * 4) << tag;
  }
}

// Column- and row-parallel pieces scale by the whole tensor's amax: one device float all-reduced
// (max) over the tensor-parallel group. Under sequence parallelism the column-parallel layers'
// backward does not gather their input again: wgrad multiplies the codes their forward kept.
TEST_F(DevicePrecision, Fp8CurrentUnderTensorParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "fp8-current-tp2", fp8("fp8_current", {"runtime.ranks=2", "parallel.tp=2"}));
  expect_bitwise_equal_runs(kGpt2, "fp8-current-tp2-sp",
                            fp8("fp8_current", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true"}));
  // The activation's codes of the split down-projection input and up-projection gradient, scaled
  // by the whole tensors' amaxes (ffn 64: 32 features a rank, a multiple of FP8's 16).
  expect_bitwise_equal_runs(kLlama, "fp8-current-llama-tp2-sp",
                            fp8("fp8_current", {"runtime.ranks=2", "parallel.tp=2", "parallel.sequence_parallel=true",
                                                "model.ffn_size=64"}));
}

// Each stage's (and data-parallel rank's) device array of amaxes, read once per step and agreed
// over the ranks holding the same layers, as on the CPU.
TEST_F(DevicePrecision, Fp8DelayedInAPipelineAndUnderDataParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "fp8-delayed-pp2",
                            fp8("fp8_delayed", {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=1f1b"}));
  expect_bitwise_equal_runs(kGpt2, "fp8-delayed-dp2", fp8("fp8_delayed", {"runtime.ranks=2", "train.micro_batch=1"}));
}

TEST_F(DevicePrecision, Mxfp8OnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "mxfp8-llama", fp8("mxfp8"));
}

// fp8_delayed's histories (filled from the device's amaxes) move through a checkpoint between the
// device and the CPU: a run stopped on one and resumed on the other equals the run that never
// stopped.
TEST_F(DevicePrecision, Fp8DelayedHistoriesMoveBetweenDeviceAndCpuThroughACheckpoint) {
  const std::vector<std::string> recipe = fp8("fp8_delayed");
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), recipe.begin(), recipe.end());
    return more;
  };
  const std::vector<double> full = train("fp8-ckpt-full", kLlama, recipe);
  train("fp8-ckpt-from-device", kLlama, with({"runtime.device=cuda"}), 2);
  EXPECT_EQ(train("fp8-ckpt-from-device", kLlama, with({"train.resume=true"})), full);
  train("fp8-ckpt-from-cpu", kLlama, recipe, 2);
  EXPECT_EQ(train("fp8-ckpt-from-cpu", kLlama, with({"train.resume=true", "runtime.device=cuda"})), full);
  expect_same_checkpoints("fp8-ckpt-full", "fp8-ckpt-from-device");
  expect_same_checkpoints("fp8-ckpt-full", "fp8-ckpt-from-cpu");
}

// An overflow inside the FP8 GEMMs: a learning rate so large that the first update makes the
// weights ~1e37, so the next forward's products overflow and Inf / NaN reach the operands of later
// FP8 GEMMs. The CPU passes such an operand on unquantized, the device's cast writes NaN: the
// outputs they reach are non-finite on both, so every later step is skipped on both, at the same
// steps, with the same skipped-step count; fp8_delayed's histories ignore the Inf amaxes on both,
// and the parameters, moments and histories end bit for bit equal.
TEST_F(DevicePrecision, AnOverflowInTheFp8GemmsSkipsTheSameStepsAsOnTheCpu) {
  for (const char* recipe : {"fp8_delayed", "fp8_current"}) {
    SCOPED_TRACE(recipe);
    const std::vector<std::string> overflow = fp8(recipe, {"optim.lr=1.0e37", "optim.clip_grad=0"});
    std::vector<std::string> on_device = overflow;
    on_device.push_back("runtime.device=cuda");
    const std::string tag = std::string("overflow-") + recipe;
    const std::vector<nlohmann::json> cpu = train_records(tag + "-cpu", kLlama, overflow);
    const std::vector<nlohmann::json> dev = train_records(tag + "-cuda", kLlama, on_device);
    ASSERT_EQ(cpu.size(), 4u);
    ASSERT_EQ(dev.size(), cpu.size());
    int skipped = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      const bool skipped_cpu = cpu[i].value("skipped", false);
      EXPECT_EQ(dev[i].value("skipped", false), skipped_cpu) << "step " << i + 1;
      skipped += skipped_cpu ? 1 : 0;
      if (!skipped_cpu) {
        EXPECT_EQ(dev[i].at("loss"), cpu[i].at("loss")) << "step " << i + 1;
      }
    }
    EXPECT_FALSE(cpu[0].value("skipped", false));  // the first step is finite
    EXPECT_GE(skipped, 2);                         // the overflow did happen, and keeps happening
    expect_same_checkpoints(tag + "-cpu", tag + "-cuda");
  }
}

}  // namespace
}  // namespace loom::train
