#pragma once
// How the norms' backward kernels cut the rows: a block per run of rows, each block summing its
// run's weight (and bias) gradients in a fixed order (in registers or shared memory) and leaving
// one partial row, which add_partial_column_sums (bias.h) adds in a fixed order. No atomics: the
// gradients are the same on every run, and no address takes one atomic add per row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/column_sums.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

struct NormBlocks {
  int64_t rows = 0;          // per block: at least 16, so at most kColumnSumChunks blocks
  int64_t count = 0;         // blocks
  size_t shared_bytes = 0;   // `arrays` floats per column
};

// `kernel`'s blocks for rows x dim with `arrays` gradient arrays in dynamic shared memory, each
// block's rows a multiple of `step` (the rows a block takes side by side: 1 to 8, dividing 16);
// asks for more than the default 48 KB of shared memory (its static share included) when dim
// needs it, up to the device's limit.
inline NormBlocks norm_blocks(int64_t rows, int64_t dim, int arrays, int64_t step, const void* kernel) {
  NormBlocks b;
  b.rows = std::max<int64_t>(16, (rows + kColumnSumChunks - 1) / kColumnSumChunks);
  b.rows = (b.rows + step - 1) / step * step;
  b.count = (rows + b.rows - 1) / b.rows;
  b.shared_bytes = static_cast<size_t>(arrays) * static_cast<size_t>(dim) * sizeof(float);
  cudaFuncAttributes attributes{};
  check_cuda(cudaFuncGetAttributes(&attributes, kernel), "cudaFuncGetAttributes (norm backward)");
  const size_t total = attributes.sharedSizeBytes + b.shared_bytes;
  if (total > 48 * 1024) {
    int device = 0, limit = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)");
    LOOM_CHECK(total <= static_cast<size_t>(limit),
               "cuda norm backward: width " + std::to_string(dim) + " needs " + std::to_string(total) +
                   " bytes of shared memory per block, more than this GPU's " + std::to_string(limit));
    // The cap set to all a block may opt into, the same value from every call: rank threads
    // sharing the GPU at other widths never lower it between another's setting and its launch.
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    limit - static_cast<int>(attributes.sharedSizeBytes)),
               "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)");
  }
  return b;
}

}  // namespace loom::kernels::cuda
