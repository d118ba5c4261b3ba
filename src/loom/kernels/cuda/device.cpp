#include "loom/kernels/cuda/device.h"

#include "loom/core/error.h"

namespace loom::kernels::cuda {

const DeviceStatus& device_status() {
  static const DeviceStatus status = [] {
    DeviceStatus s;
    int count = 0;
    const cudaError_t result = cudaGetDeviceCount(&count);
    if (result != cudaSuccess) {
      s.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(result) + " (" +
                 cudaGetErrorString(result) + ")";
      cudaGetLastError();  // the query's error is not sticky; clear it for later calls
      return s;
    }
    if (count == 0) {
      s.reason = "the CUDA runtime sees no device";
      return s;
    }
    s.available = true;
    s.devices = count;
    return s;
  }();
  return status;
}

void check_cuda(cudaError_t result, const std::string& what) {
  if (result == cudaSuccess) return;
  throw Error("CUDA: " + what + " failed: " + cudaGetErrorName(result) + " (" + cudaGetErrorString(result) + ")");
}

void check_launch(const std::string& kernel, bool synchronize) {
  check_cuda(cudaGetLastError(), "launch of " + kernel);
  if (synchronize) check_cuda(cudaDeviceSynchronize(), kernel);
}

}  // namespace loom::kernels::cuda
