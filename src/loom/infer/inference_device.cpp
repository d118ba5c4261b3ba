#include "loom/infer/inference_device.h"

#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::infer {

Device inference_device(config::RuntimeDevice device, int rank) {
  if (device == config::RuntimeDevice::Cpu) return Device::cpu();
  int devices = 0;
  try {
    devices = kernels::start_cuda();
  } catch (const Error& e) {
    throw Error(std::string("--device cuda: ") + e.what());
  }
  LOOM_CHECK(devices > 0, "--device cuda: the CUDA backend serves no GPU");
  return Device::cuda(rank % devices);
}

}  // namespace loom::infer
