// ZeRO stages 1, 2 and 3 over two data-parallel ranks with runtime.device=cuda on the emulated
// device (the ranks share it through the threads backend): the master weights, moments, reduced
// gradient shards and reduce-scatter staging live on the device, so any host access to them
// crashes, and each stage's run equals the same stage on the CPU bit for bit (losses, clipped
// at 0.5 by the fixture, and every tensor of the final checkpoint). That the CPU stages train
// as one rank does is tested in data_parallel_test.cpp and tests/parallel/.
#include "device_training.h"
#include "support/emulated_device_comm.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

std::vector<std::string> zero(int stage, std::vector<std::string> extra = {}) {
  std::vector<std::string> overrides = {"runtime.ranks=2", "train.micro_batch=1", "parallel.zero=" + std::to_string(stage)};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return overrides;
}

TEST_F(DeviceLayouts, Zero1OnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kLlama, "zero1", zero(1)); }

// Two micro-batches per rank: the second round's reduced shards are added on the device.
TEST_F(DeviceLayouts, Zero2OnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kLlama, "zero2", zero(2)); }

TEST_F(DeviceLayouts, Zero3OnTheDeviceEqualsTheCpuBitForBit) { expect_bitwise_equal_runs(kLlama, "zero3", zero(3)); }

// Biases, an untied head and learned positions: every section's shards, gathered unit by unit;
// with an evaluation every 2 steps, for which the whole model is gathered on the device.
TEST_F(DeviceLayouts, Zero3Gpt2StyleOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "zero3-gpt2",
                            zero(3, {"data.val_prefix=" + root_ + "/data/c_train", "train.eval_interval=2",
                                     "train.eval_batches=1"}));
}

// Recompute runs each unit's forward again inside its backward, between the gathers.
TEST_F(DeviceLayouts, Zero3WithRecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "zero3-recompute", zero(3, {"model.recompute=true"}));
}

// ZeRO 1 and 2 with a pipeline of two stages (dp 2 per stage; the tied embedding's gradient
// summed over the first and last stage before the reduce-scatter); the interleaved schedule
// reduces once per step at ZeRO-2.
TEST_F(DeviceLayouts, ZeroWithPipelineParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  const std::vector<std::string> pipeline = {"runtime.ranks=4", "parallel.pp=2", "train.micro_batch=1"};
  std::vector<std::string> zero1 = pipeline, zero2 = pipeline;
  zero1.push_back("parallel.zero=1");
  zero2.insert(zero2.end(), {"parallel.zero=2", "parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2",
                             "model.layers=4"});
  expect_bitwise_equal_runs(kLlama, "zero1-pp2", zero1);
  expect_bitwise_equal_runs(kLlama, "zero2-pp2-interleaved", zero2);
}

// tp 2 x dp 2: the norm sums the shards over the data-parallel group, then over the
// tensor-parallel one, each replicated parameter counted on one rank.
TEST_F(DeviceLayouts, ZeroWithTensorParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  for (int stage : {1, 3}) {
    expect_bitwise_equal_runs(kLlama, "zero" + std::to_string(stage) + "-tp2",
                              {"runtime.ranks=4", "parallel.tp=2", "train.micro_batch=1",
                               "parallel.zero=" + std::to_string(stage)});
  }
}

// runtime.device_comm=nccl: the reduce-scatters and gathers of device shards go to the device
// backend (here the emulated one, which refuses host memory) unstaged.
TEST_F(DeviceLayouts, ZeroWithADeviceBackendEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator();
  for (int stage : {1, 2, 3}) {
    const int64_t before = ::loom::testing::emulated_device_operations();
    expect_bitwise_equal_runs(kLlama, "zero" + std::to_string(stage) + "-device-comm", zero(stage),
                              {"runtime.device_comm=nccl"});
    EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0) << "zero " << stage;
  }
}

// parallel.overlap_param_gather: the update's gathers left in flight and awaited unit by unit
// (on the device backend in the compute queue's order), staged through the host and unstaged.
TEST_F(DeviceLayouts, ZeroWithOverlappedParameterGathersOnTheDeviceEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator();
  for (int stage : {1, 2}) {
    const std::string tag = "zero" + std::to_string(stage) + "-overlapped-gathers";
    const std::vector<std::string> overlapped = zero(stage, {"parallel.overlap_param_gather=true"});
    expect_bitwise_equal_runs(kLlama, tag, overlapped);
    expect_bitwise_equal_runs(kLlama, tag + "-device-comm", overlapped, {"runtime.device_comm=nccl"});
  }
}

// A ZeRO-3 checkpoint written on the device holds every rank's shards of the parameters and
// moments: it resumes on the CPU to the uninterrupted run's losses bit for bit; at ZeRO-1 (another
// sharding of the same state) on the device as on the CPU, and within fp32 rounding of the
// uninterrupted run (the norm sums its squares in another order). A ZeRO-1 checkpoint from the
// CPU resumes at ZeRO-3 on the device likewise.
TEST_F(DeviceLayouts, Zero3CheckpointsMoveBetweenDeviceCpuAndStages) {
  const std::vector<double> full = train("zero3-full", kLlama, zero(3));
  ASSERT_EQ(full.size(), 4u);
  train("zero3-from-device", kLlama, zero(3, {"runtime.device=cuda"}), 2);
  EXPECT_EQ(train("zero3-from-device", kLlama, zero(3, {"train.resume=true"})), full);
  expect_same_checkpoints("zero3-full", "zero3-from-device");

  train("zero3-to-zero1-cuda", kLlama, zero(3, {"runtime.device=cuda"}), 2);
  const std::vector<double> on_device = train("zero3-to-zero1-cuda", kLlama, zero(1, {"train.resume=true", "runtime.device=cuda"}));
  train("zero3-to-zero1-cpu", kLlama, zero(3), 2);
  EXPECT_EQ(on_device, train("zero3-to-zero1-cpu", kLlama, zero(1, {"train.resume=true"})));
  expect_same_checkpoints("zero3-to-zero1-cpu", "zero3-to-zero1-cuda");
  testing::expect_same_losses(full, on_device);

  train("zero1-to-zero3-cuda", kLlama, zero(1), 2);
  testing::expect_same_losses(full, train("zero1-to-zero3-cuda", kLlama, zero(3, {"train.resume=true", "runtime.device=cuda"})));
}

}  // namespace
}  // namespace loom::train
