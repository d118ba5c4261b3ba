#pragma once
// Zeroing many runs of one float buffer at once (kernels::zero_runs): the gradient buffer around
// the ranges its GEMMs write whole, in one launch per kMaxZeroRunsPerLaunch small runs (a run of
// more than 64K floats, an embedding table, a memset of its own) rather than a memset per run.
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/types.h"

namespace loom::kernels::cuda {

// The runs go to the kernel as its argument (2 KB of the 4 KB a launch takes).
constexpr int kMaxZeroRunsPerLaunch = 128;

void zero_runs(float* base, const FloatRun* runs, int64_t count, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
