// The FP8 and MX recipes with runtime.device=cuda on the emulated device (its precision GEMM is
// the CPU's emulation of the recipe, fed what a GPU is fed: fp8_current's scale from the amax
// reduced on the device, fp8_delayed's scale from the host's history with the amaxes accumulated
// on the device and read once per step): each run equals the same run on the CPU bit for bit
// (losses and every tensor of the final checkpoint). The edge blocks take FP8 too
// (precision.fp8_edge_layers_bf16=false), so both blocks of the small models run it.
#include "device_training.h"

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

TEST_F(DevicePrecision, Fp8CurrentOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "fp8-current-gpt2-recompute", fp8("fp8_current", {"model.recompute=true"}));
  expect_bitwise_equal_runs(kLlama, "fp8-current-llama", fp8("fp8_current"));
}

// Column- and row-parallel pieces scale by the whole tensor's amax: one device float all-reduced
// (max) over the tensor-parallel group.
TEST_F(DevicePrecision, Fp8CurrentUnderTensorParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "fp8-current-tp2", fp8("fp8_current", {"runtime.ranks=2", "parallel.tp=2"}));
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

}  // namespace
}  // namespace loom::train
