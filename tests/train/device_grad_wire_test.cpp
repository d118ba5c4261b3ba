// precision.grad_reduce=bf16 on the emulated device: each data-parallel stage rounds its gradients
// to bf16 on the device (kernels::narrow_floats) into a device staging buffer, reduces it there
// and widens the result back (kernels::widen_floats), at ZeRO 0 (bucketed all-reduce), 1 and 2
// (the buckets' reduce-scatters) and 3 (the units'), and equals the same run on the CPU bit for
// bit. That the bf16 wire is close to the fp32 one is tested in precision_training_test.cpp.
#include "device_training.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

std::vector<std::string> bf16_wire(int stage) {
  return {"runtime.ranks=2", "train.micro_batch=1", "precision.grad_reduce=bf16",
          "parallel.zero=" + std::to_string(stage)};
}

TEST_F(DeviceLayouts, Bf16GradientReductionOnTheDeviceEqualsTheCpuBitForBit) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(stage));
    expect_bitwise_equal_runs(kLlama, "bf16-wire-zero" + std::to_string(stage), bf16_wire(stage));
  }
}

// The bf16 recipe with its parameters in bf16 (precision.param_dtype=compute: compact stores,
// master weights and bf16 gathers on the device) and the bf16 wire, at ZeRO 0 and 3.
TEST_F(DeviceLayouts, Bf16RecipeWithComputeDtypeParametersOnTheDeviceEqualsTheCpuBitForBit) {
  for (int stage : {0, 3}) {
    std::vector<std::string> overrides = bf16_wire(stage);
    overrides.insert(overrides.end(), {"precision.recipe=bf16", "precision.param_dtype=compute"});
    expect_bitwise_equal_runs(kLlama, "bf16-params-zero" + std::to_string(stage), overrides);
  }
}

// Biases and an untied head (more buckets and sections); ZeRO-3 with recompute.
TEST_F(DeviceLayouts, Bf16GradientReductionGpt2StyleOnTheDeviceEqualsTheCpuBitForBit) {
  std::vector<std::string> overrides = bf16_wire(3);
  overrides.push_back("model.recompute=true");
  expect_bitwise_equal_runs(kGpt2, "bf16-wire-gpt2-zero3", overrides);
  expect_bitwise_equal_runs(kGpt2, "bf16-wire-gpt2-zero0", bf16_wire(0));
}

}  // namespace
}  // namespace loom::train
