#pragma once
// The CUDA device as loom sees it: whether a usable GPU is there (any error from the runtime's
// device query means no, with the runtime's words for why: on a machine without a driver it is
// cudaErrorInsufficientDriver, not cudaErrorNoDevice), and checked calls.
#include <cuda_runtime.h>

#include <string>

namespace loom::kernels::cuda {

struct DeviceStatus {
  bool available = false;
  int devices = 0;
  std::string reason;  // why not, when not available
};

// Queries once per process.
const DeviceStatus& device_status();

// Throws loom::Error naming `what` and the runtime's error when `result` is not cudaSuccess.
void check_cuda(cudaError_t result, const std::string& what);
// After a kernel launch: the launch's own error, then (when `synchronize`) the kernel's.
void check_launch(const std::string& kernel, bool synchronize = false);

}  // namespace loom::kernels::cuda
