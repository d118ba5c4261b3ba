// runtime.device=cuda on the emulated device of the tests (tests/support/emulated_cuda.h): the
// model's memory is device memory the host cannot read, and the ops are the CPU kernels, so a
// training run on it must equal the same run on the CPU bit for bit (losses and every tensor of
// the final checkpoint), and any host access to device memory in the model or trainer crashes.
// Checkpoints move freely between the two.
#include "device_training.h"

namespace loom::train {
namespace {

TEST_F(DeviceTraining, LlamaStyleOnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kLlama, "llama"); }

TEST_F(DeviceTraining, Gpt2StyleOnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kGpt2, "gpt2"); }

// Nemotron's squared ReLU MLP.
TEST_F(DeviceTraining, SquaredReluOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "relu2", {"model.activation=relu2"});
}

// Multi-token prediction (two depths): the shifted embeddings, eh_proj over [enorm | hnorm] rows
// and the depths' blocks and losses on the device; with recompute too.
TEST_F(DeviceTraining, MultiTokenPredictionOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "mtp", {"model.mtp_depths=2"});
  expect_bitwise_equal_runs(kGpt2, "mtp-recompute", {"model.mtp_depths=1", "model.recompute=true"});
}

TEST_F(DeviceTraining, RecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "recompute", {"model.recompute=true"});
}

// Attention with bf16 operands (precision.attention=bf16, what the bf16 and FP8 recipes choose):
// q, k, v and out rounded on the device, with recompute too.
TEST_F(DeviceTraining, Bf16AttentionOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "bf16-attention", {"precision.attention=bf16"});
  expect_bitwise_equal_runs(kGpt2, "bf16-attention-recompute", {"precision.attention=bf16", "model.recompute=true"});
}

// A checkpoint written on the device resumes on the CPU (and the other way round) to the same
// next losses as the run that never stopped.
TEST_F(DeviceTraining, CheckpointsMoveBetweenDeviceAndCpu) {
  const std::vector<double> full = expect_checkpoints_move_between_devices(kLlama, "");
  // train.init_from reads the parameters onto the device too.
  const std::string init = "train.init_from=" + root_ + "/full/checkpoints";
  EXPECT_EQ(train("init-cuda", kLlama, {init, "runtime.device=cuda"}, 2), train("init-cpu", kLlama, {init}, 2));
}

// What the device does not run yet is refused before anything is built, naming the setting.
TEST_F(DeviceTraining, UnsupportedSettingsOnTheDeviceNameTheirKey) {
  auto error_of = [&](const char* model, std::vector<std::string> overrides) -> std::string {
    overrides.insert(overrides.begin(), "runtime.device=cuda");
    try {
      train("refused", model, overrides, 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string bad = error_of(kLlama, {"runtime.device=gpu"});
  EXPECT_NE(bad.find("runtime.device"), std::string::npos) << bad;
  EXPECT_NE(bad.find("cuda"), std::string::npos) << bad;
}

}  // namespace
}  // namespace loom::train
