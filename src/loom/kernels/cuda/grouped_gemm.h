#pragma once
// Several independent precision GEMMs in one call (kernels::precision_linear_gemms): an MoE layer's
// experts, each a small product of its own rows. Run one by one, each is a cuBLASLt call of a few
// microseconds of host time for a product that may take less on the GPU, so at many experts the
// host, not the GPU, sets the pace. The groupable ones (kernels::groupable: bf16 tensors in, no
// epilogue), with 16-byte aligned operands and rows, run instead as one cuBLAS grouped product
// (cublasGemmGroupedBatchedEx: every GEMM its own shape, one launch) per output kind, where their
// mean rows are at most grouped_gemm_most_rows(): bf16 outputs; fp32 outputs rounded to bf16
// (a forward's or dgrad's: the product writes bf16 into scratch, widened into place after in one
// pass per run of adjacent outputs, as one by one cuBLASLt writes bf16 and a pass widens it); and
// weight gradients' fp32, written or added into (cuBLAS 13.1 ships grouped kernels with bf16
// outputs only, so it may refuse these). cuBLAS's grouped kernels use warp-level MMA rather than
// Hopper's wgmma, so large products run faster one by one (hence the rows cap). Where cuBLAS
// refuses a kind (NOT_SUPPORTED, ARCH_MISMATCH; remembered per device), its GEMMs run one by one,
// said once on stderr; any other cuBLAS failure is an Error. The others always run one by one
// (precision_gemm.h). The results equal one by one's within bf16's rounding: another kernel sums
// in another order (CudaGroupedGemm.*).
#include <cuda_runtime.h>

#include <cstdint>

#include "loom/kernels/precision_gemm.h"

namespace loom::kernels::cuda {

void precision_linear_gemms(const PrecisionGemm* gemms, int64_t count, cudaStream_t stream = nullptr);

// The largest mean rows per GEMM that still runs grouped, read once from LOOM_GROUPED_GEMM_ROWS
// (unset or empty: 256; 0: never grouped; a count up to 2^20; another value is a loom::Error
// naming the variable). set_grouped_gemm_most_rows: that value from now on (a test or benchmark
// comparing both ways); -1 returns to the environment's.
int64_t grouped_gemm_most_rows();
void set_grouped_gemm_most_rows(int64_t rows);

// Grouped products this process ran, and calls whose GEMMs ran one by one because cuBLAS refused
// (or had refused) a grouped product of their output kind, on any device.
struct GroupedGemmCounts {
  int64_t grouped = 0, refused = 0;
};
GroupedGemmCounts grouped_gemm_counts();

}  // namespace loom::kernels::cuda
