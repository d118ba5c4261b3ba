// Pipeline parallelism with runtime.device=cuda on the emulated device: two stages (rank threads
// sharing the device) send activations and their gradients as device buffers, keep each
// micro-batch's activations on the device and sum the tied embedding's gradient between the
// first and last stage; every schedule equals the same layout on the CPU bit for bit (losses and
// every tensor of the final checkpoint). That the CPU pipeline trains as one rank does is tested
// in pipeline_parallel_test.cpp.
#include "device_training.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

// The fixture's global batch of 4 in micro-batches of 2: 2 micro-batches per step.
std::vector<std::string> pp2(const std::string& schedule, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"runtime.ranks=2", "parallel.pp=2", "parallel.pipeline_schedule=" + schedule};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

// Tied embeddings: the last stage's head is a copy of the first stage's embedding. 4 micro-batches
// of 1, so the second stage runs 1F1B's steady state; evaluation runs through the stages too.
TEST_F(DeviceLayouts, Pipeline1f1bOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "pp2-1f1b",
                            pp2("1f1b", {"train.micro_batch=1", "data.val_prefix=" + root_ + "/data/c_train",
                                         "train.eval_interval=2", "train.eval_batches=2"}));
  const std::vector<double> on_cpu = validation_losses(root_, "pp2-1f1b-cpu");
  EXPECT_EQ(on_cpu.size(), 2u);
  EXPECT_EQ(validation_losses(root_, "pp2-1f1b-cuda"), on_cpu);
}

TEST_F(DeviceLayouts, PipelineGpipeWithRecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "pp2-gpipe", pp2("gpipe", {"model.recompute=true"}));
}

// Two model chunks per rank: 4 virtual stages of one layer each.
TEST_F(DeviceLayouts, InterleavedPipelineOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "pp2-interleaved-llama",
                            pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4"}));
  expect_bitwise_equal_runs(kGpt2, "pp2-interleaved-gpt2",
                            pp2("interleaved", {"parallel.virtual_stages=2", "model.layers=4"}));
}

// 2 stages x 2 data-parallel replicas, each replica 2 micro-batches of 1.
TEST_F(DeviceLayouts, PipelineWithDataParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "pp2-dp2", {"runtime.ranks=4", "parallel.pp=2", "train.micro_batch=1"});
}

// A pipeline checkpoint written on the device resumes on the CPU to the same next losses as the
// run that never stopped, and the other way round; train.init_from reads one onto the device.
TEST_F(DeviceLayouts, PipelineCheckpointsMoveBetweenDeviceAndCpu) {
  const std::vector<std::string> layout = pp2("1f1b");
  const std::vector<double> full = train("pp2-full", kLlama, layout);
  ASSERT_EQ(full.size(), 4u);
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> overrides = layout;
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    return overrides;
  };
  train("pp2-from-device", kLlama, with({"runtime.device=cuda"}), 2);
  EXPECT_EQ(train("pp2-from-device", kLlama, with({"train.resume=true"})), full);
  train("pp2-from-cpu", kLlama, layout, 2);
  EXPECT_EQ(train("pp2-from-cpu", kLlama, with({"train.resume=true", "runtime.device=cuda"})), full);
  expect_same_checkpoints("pp2-full", "pp2-from-device");
  expect_same_checkpoints("pp2-full", "pp2-from-cpu");
  // train.init_from uploads each stage's parameters.
  const std::string init = "train.init_from=" + root_ + "/pp2-full/checkpoints";
  EXPECT_EQ(train("pp2-init-cuda", kLlama, with({init, "runtime.device=cuda"}), 2),
            train("pp2-init-cpu", kLlama, with({init}), 2));
}

}  // namespace
}  // namespace loom::train
