#pragma once
// Starts the CUDA backend: registers a caching allocator for every usable GPU with the core
// layer's allocator registry (core/device.h) and the CUDA kernels with the device-neutral entries
// (kernels/cuda_entries.h). After this, buffers and ops on Device::cuda(i) work wherever a kernel
// exists. Idempotent; throws loom::Error with the runtime's reason when no GPU is usable.
namespace loom::kernels::cuda {

void start_backend();

}  // namespace loom::kernels::cuda
