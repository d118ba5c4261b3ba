#pragma once
// One object per GPU of the process (a library handle, a cache), or per GPU and compute stream,
// made on first use on the current device and never destroyed: at exit the CUDA runtime and its
// libraries may already be gone.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

constexpr int kMaxDevices = 16;

// The current device, checked against kMaxDevices; `what` names the objects in errors.
inline int current_object_device(const char* what) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  LOOM_CHECK(device < kMaxDevices, std::string(what) + ": device " + std::to_string(device) + " beyond the supported " +
                                       std::to_string(kMaxDevices));
  return device;
}

// Objects[index], made by make() (returning std::unique_ptr<T>) the first time.
template <typename T, size_t N, typename Make>
T& object_at(std::array<std::unique_ptr<T>, N>& objects, std::mutex& mutex, int index, Make& make) {
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = objects[static_cast<size_t>(index)];
  if (!slot) slot = make();
  return *slot;
}

// The current device's T. Each call site (each Make) has its own objects.
template <typename T, typename Make>
T& current_device_object(const char* what, Make make) {
  static auto* objects = new std::array<std::unique_ptr<T>, kMaxDevices>();
  static std::mutex mutex;
  return object_at(*objects, mutex, current_object_device(what), make);
}

// The current device's T for the calling thread's compute stream (compute_streams.h): what a
// stream's queued work uses while it runs (a workspace, scratch) is never another stream's, whose
// work may run at the same time.
template <typename T, typename Make>
T& current_stream_object(const char* what, Make make) {
  static auto* objects = new std::array<std::unique_ptr<T>, kMaxDevices * kComputeStreams>();
  static std::mutex mutex;
  return object_at(*objects, mutex, current_object_device(what) * kComputeStreams + compute_stream_slot(), make);
}

}  // namespace loom::kernels::cuda
