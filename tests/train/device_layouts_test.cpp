// Parallel layouts with runtime.device=cuda on the emulated device, several ranks sharing it
// through the threads backend (their collectives stage device buffers through the host:
// comm/device_staging.h): each layout's run equals the same layout on the CPU bit for bit
// (losses and every tensor of the final checkpoint). That the CPU layouts train as one rank does
// is tested in the layouts' own tests (data_parallel_test.cpp, ...).
#include "device_training.h"
#include "support/emulated_device_comm.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

TEST_F(DeviceLayouts, DataParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "dp2", {"runtime.ranks=2", "train.micro_batch=1"});
}

// runtime.device_comm=nccl: the gradients' collectives go to the device backend (here the
// emulated one, which refuses host memory), the host scalars' to the threads backend.
TEST_F(DeviceLayouts, DataParallelWithADeviceBackendEqualsTheCpuBitForBit) {
  ::loom::testing::install_emulated_device_communicator();
  const int64_t before = ::loom::testing::emulated_device_operations();
  expect_bitwise_equal_runs(kLlama, "dp2-device-comm", {"runtime.ranks=2", "train.micro_batch=1"},
                            {"runtime.device_comm=nccl"});
  EXPECT_GT(::loom::testing::emulated_device_operations() - before, 0);
}

TEST_F(DeviceLayouts, ADeviceBackendIsRefusedWhereItCannotServe) {
  auto error_of = [&](std::vector<std::string> overrides) -> std::string {
    try {
      train("refused-device-comm", kLlama, overrides, 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  // Five ranks of one process on the four emulated GPUs.
  const std::string shared = error_of({"runtime.device=cuda", "runtime.device_comm=nccl", "runtime.ranks=5",
                                       "train.global_batch=5", "train.micro_batch=1"});
  EXPECT_NE(shared.find("runtime.device_comm=nccl: 5 ranks of this process on 4 GPU(s)"), std::string::npos) << shared;
  const std::string on_cpu = error_of({"runtime.device_comm=nccl"});
  EXPECT_NE(on_cpu.find("runtime.device_comm=nccl needs runtime.device=cuda"), std::string::npos) << on_cpu;
}

}  // namespace
}  // namespace loom::train
