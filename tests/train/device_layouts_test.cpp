// Parallel layouts with runtime.device=cuda on the emulated device, several ranks sharing it
// through the threads backend (their collectives stage device buffers through the host:
// comm/device_staging.h): each layout's run equals the same layout on the CPU bit for bit
// (losses and every tensor of the final checkpoint). That the CPU layouts train as one rank does
// is tested in the layouts' own tests (data_parallel_test.cpp, ...).
#include "device_training.h"

namespace loom::train {
namespace {

using DeviceLayouts = DeviceTraining;

TEST_F(DeviceLayouts, DataParallelOnTheDeviceEqualsTheCpuBitForBit) {
  expect_bitwise_equal_runs(kLlama, "dp2", {"runtime.ranks=2", "train.micro_batch=1"});
}

}  // namespace
}  // namespace loom::train
