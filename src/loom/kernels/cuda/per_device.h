#pragma once
// One object per GPU of the process (a library handle, a cache), made on first use on the current
// device and never destroyed: at exit the CUDA runtime and its libraries may already be gone.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

constexpr int kMaxDevices = 16;

// The current device's T, made by make() (returning std::unique_ptr<T>) the first time. Each
// call site (each Make) has its own objects; `what` names them in errors.
template <typename T, typename Make>
T& current_device_object(const char* what, Make make) {
  static auto* objects = new std::array<std::unique_ptr<T>, kMaxDevices>();
  static std::mutex mutex;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  LOOM_CHECK(device < kMaxDevices, std::string(what) + ": device " + std::to_string(device) + " beyond the supported " +
                                       std::to_string(kMaxDevices));
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*objects)[static_cast<size_t>(device)];
  if (!slot) slot = make();
  return *slot;
}

}  // namespace loom::kernels::cuda
