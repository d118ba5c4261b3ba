// Tensor and sequence parallelism with runtime.device=cuda on the emulated device, the ranks
// sharing it through the threads backend: each run equals the same layout on the CPU bit for bit
// (losses and every tensor of the final checkpoint). That the CPU layouts train as one rank does
// is tested in tensor_parallel_test.cpp.
#include "device_training.h"
#include "support/emulated_device_comm.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

const std::vector<std::string> kTp2 = {"runtime.ranks=2", "parallel.tp=2"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// kLlama has kv_heads 2 over tp 2: one kv head per rank; tied embeddings split by vocabulary.
// With one kv head, both ranks hold it and their gradients of it are summed (TensorParallelGrads).
TEST_F(DeviceLayouts, TensorParallelLlamaOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "tp2-llama", kTp2);
  expect_bitwise_equal_runs(kLlama, "tp2-llama-kv1", with(kTp2, {"model.kv_heads=1"}));
}

// Column- and row-parallel biases, learned positions, an untied vocabulary-parallel head.
TEST_F(DeviceLayouts, TensorParallelGpt2OnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "tp2-gpt2", kTp2);
}

// Rows scattered and gathered around the regions; norms' gradients summed over the tp group.
// Evaluation runs the same forward, to the same validation losses.
TEST_F(DeviceLayouts, SequenceParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "tp2-sp-llama",
                            with(kTp2, {"parallel.sequence_parallel=true", "data.val_prefix=" + root_ + "/data/c_train",
                                        "train.eval_interval=2", "train.eval_batches=2"}));
  const std::vector<double> on_cpu = validation_losses(root_, "tp2-sp-llama-cpu");
  EXPECT_EQ(on_cpu.size(), 2u);
  EXPECT_EQ(validation_losses(root_, "tp2-sp-llama-cuda"), on_cpu);
  expect_bitwise_equal_runs(kGpt2, "tp2-sp-gpt2", with(kTp2, {"parallel.sequence_parallel=true"}));
}

TEST_F(DeviceLayouts, TensorParallelWithRecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "tp2-recompute", with(kTp2, {"model.recompute=true"}));
  expect_bitwise_equal_runs(kLlama, "tp2-sp-recompute",
                            with(kTp2, {"parallel.sequence_parallel=true", "model.recompute=true"}));
}

// runtime.device_comm=nccl: the tp group's collectives go to the device backend (here the emulated
// one, which refuses host memory), so every buffer the operators hand it is device memory.
TEST_F(DeviceLayouts, SequenceParallelWithADeviceBackendEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator();
  const int64_t before = ::loom::testing::emulated_device_operations();
  expect_bitwise_equal_runs(kGpt2, "tp2-sp-device-comm", with(kTp2, {"parallel.sequence_parallel=true"}),
                            {"runtime.device_comm=nccl"});
  EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
}

// Multi-token prediction's modules gather their rows around the same operators.
TEST_F(DeviceLayouts, SequenceParallelWithMultiTokenPredictionOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "tp2-sp-mtp", with(kTp2, {"parallel.sequence_parallel=true", "model.mtp_depths=1"}));
}

// tp 2 x dp 2 on one mesh of 4 ranks.
TEST_F(DeviceLayouts, TensorTimesDataParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "tp2-dp2",
                            {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true", "train.micro_batch=1"});
}

// tp 2 x pp 2: each stage's two tensor-parallel ranks send their activations to the next stage's.
TEST_F(DeviceLayouts, TensorTimesPipelineParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "tp2-pp2",
                            {"runtime.ranks=4", "parallel.tp=2", "parallel.pp=2", "parallel.sequence_parallel=true",
                             "parallel.pipeline_schedule=1f1b", "train.micro_batch=1"});
}

// A tp 2 checkpoint written on the device resumes on the CPU (and the reverse) with the losses
// of the uninterrupted run.
TEST_F(DeviceLayouts, TensorParallelCheckpointsMoveBetweenDeviceAndCpu) {
  const std::vector<double> full = train("tp2-full", kGpt2, kTp2);
  train("tp2-from-device", kGpt2, with(kTp2, {"runtime.device=cuda"}), 2);
  EXPECT_EQ(train("tp2-from-device", kGpt2, with(kTp2, {"train.resume=true"})), full);
  train("tp2-from-cpu", kGpt2, kTp2, 2);
  EXPECT_EQ(train("tp2-from-cpu", kGpt2, with(kTp2, {"train.resume=true", "runtime.device=cuda"})), full);
  expect_same_checkpoints("tp2-full", "tp2-from-device");
  expect_same_checkpoints("tp2-full", "tp2-from-cpu");
}

}  // namespace
}  // namespace loom::train
