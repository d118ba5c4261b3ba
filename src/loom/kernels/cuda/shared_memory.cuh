#pragma once
// Dynamic shared memory beyond the default: without the kernel's consent a block gets 48 KiB of
// shared memory in all, its static share included, so dynamic bytes just under 48 KiB may still
// need it (the attention kernels' token metadata and statistics arrays are static).
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), std::string("cudaFuncGetAttributes(") + name + ")");
  if (attributes.sharedSizeBytes + bytes > 48 * 1024)
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
               std::string("cudaFuncSetAttribute(") + name + ")");
}

}  // namespace loom::kernels::cuda
