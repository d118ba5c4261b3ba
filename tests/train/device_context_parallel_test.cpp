// Context parallelism (parallel.cp = 2, ring attention and Ulysses all-to-all) with
// runtime.device=cuda on the emulated device, the ranks sharing it through the threads backend:
// each run equals the same layout on the CPU bit for bit (losses and every checkpoint tensor).
// That the CPU layouts train as one rank does is tested in context_parallel_test.cpp.
#include <string>

#include "device_training.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

TEST_F(DeviceLayouts, RingAttentionOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "cp2-p2p", {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=p2p"});
}

TEST_F(DeviceLayouts, AllToAllContextParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kGpt2, "cp2-a2a", {"runtime.ranks=2", "parallel.cp=2", "parallel.cp_comm=a2a"});
}

// Both exchanges with bf16 attention operands: ring attention's partial outputs are rounded per
// block of keys and merged in fp32, Ulysses' heads attend in bf16.
TEST_F(DeviceLayouts, ContextParallelWithBf16AttentionOnTheDeviceEqualsTheCpuBitForBit) {
  for (const char* comm : {"p2p", "a2a"}) {
    expect_bitwise_equal_runs(kLlama, std::string("cp2-bf16-attention-") + comm,
                              {"runtime.ranks=2", "parallel.cp=2", std::string("parallel.cp_comm=") + comm,
                               "precision.attention=bf16"});
  }
}

// Packed documents: the gathered document ids and the positions reach the kernels as device arrays.
TEST_F(DeviceLayouts, ContextParallelWithPackedDocumentsOnTheDeviceEqualsTheCpuBitForBit) {
  for (const char* comm : {"p2p", "a2a"}) {
    expect_bitwise_equal_runs(kLlama, std::string("cp2-packed-") + comm,
                              {"runtime.ranks=2", "parallel.cp=2", std::string("parallel.cp_comm=") + comm,
                               "data.reset_attention_mask=true", "data.reset_position_ids=true", "data.eod_mask_loss=true"});
  }
}

TEST_F(DeviceLayouts, ContextParallelWithDataParallelismAndRecomputeOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "cp2-dp2", {"runtime.ranks=4", "parallel.cp=2", "train.micro_batch=1",
                                                "model.recompute=true"});
}

// Megatron's rank order tp-cp: sequence-parallel tensor parallelism inside each context shard.
TEST_F(DeviceLayouts, ContextParallelWithTensorParallelismOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "tp2-sp-cp2", {"runtime.ranks=4", "parallel.tp=2", "parallel.sequence_parallel=true",
                                                   "parallel.cp=2", "parallel.cp_comm=p2p"});
}

}  // namespace
}  // namespace loom::train
