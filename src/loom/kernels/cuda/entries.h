#pragma once
// Fills the device-neutral entries (kernels/cuda_entries.h) with this backend's kernels, each run
// on the device's compute stream. Called once by start_backend().
#include "loom/kernels/cuda_entries.h"

namespace loom::kernels::cuda {

void register_kernels(CudaEntries& entries);

}  // namespace loom::kernels::cuda
