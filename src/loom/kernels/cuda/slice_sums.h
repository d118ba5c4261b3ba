#pragma once
// Deterministic sums over many rows on the device, in two stages: a kernel writes partial sums of
// `slices` row slices in double ([slice][stride] in a scratch buffer), then add_slice_sums adds
// each column's slices, in slice order, into a float output (out[i] += sum_s partial[s * stride +
// i] for i < width). Used by the parameter gradients that the CPU sums over rows in order.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

// How many row slices to sum `rows` rows of `width` columns in: enough blocks to fill the GPU,
// at most `rows` and a bounded scratch.
int64_t row_slices(int64_t rows, int64_t width);

void add_slice_sums(float* out, const double* partial, int64_t slices, int64_t width, int64_t stride,
                    cudaStream_t stream);

}  // namespace loom::kernels::cuda
