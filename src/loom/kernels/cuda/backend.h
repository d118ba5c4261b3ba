#pragma once
// Starts the CUDA backend: registers a caching allocator for every usable GPU with the core
// layer's allocator registry (core/device.h) and the CUDA kernels with the device-neutral entries
// (kernels/cuda_entries.h). After this, buffers and ops on Device::cuda(i) work wherever a kernel
// exists. Idempotent; throws loom::Error with the runtime's reason when no GPU is usable.
#include <cuda_runtime.h>

namespace loom::kernels::cuda {

void start_backend();

// The stream the entries run device `index`'s kernels on (today the default stream; the compute
// stream of the rank's device once the trainer runs there, see docs/architecture.md).
cudaStream_t compute_stream(int index);

}  // namespace loom::kernels::cuda
