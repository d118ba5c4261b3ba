#pragma once
// The bias halves of the linear layer on the device: rows of out set to (or increased by) the
// bias before the product accumulates into them, and the bias gradient as column sums in
// kernels/column_sums.h's order (chunks of rows summed by a thread per (chunk, column), groups of
// chunks by a thread per (group, column), the groups in order by a thread per column):
// deterministic, the CPU's bits.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void broadcast_bias(float* out, const float* bias, int64_t rows, int64_t cols, bool accumulate,
                    cudaStream_t stream = nullptr);
void add_column_sums(float* sums, const float* x, int64_t rows, int64_t cols, cudaStream_t stream = nullptr);
// The same over bf16 values (2-byte elements), each widened exactly.
void add_column_sums_bf16(float* sums, const void* x16, int64_t rows, int64_t cols, cudaStream_t stream = nullptr);
// The launch of a kernel that sums the columns of [rows, cols] by a thread per (column, chunk of
// rows), in column_sums.h's order: `chunk` rows per chunk, `chunks` of them, over `grid` of
// kThreads-thread blocks (column blocks along x, chunks along y). An Error naming `what` where
// that exceeds one grid.
struct ColumnChunks {
  int64_t chunk, chunks;
  dim3 grid;
};
ColumnChunks column_chunks(int64_t rows, int64_t cols, const char* what);
// sums[c] += the column sums of partial[chunks, cols] (chunks <= kColumnSumChunks), added in
// column_sums.h's order of chunk sums: groups of 32 from zero, then the groups in order. Also the
// norms' weight gradients, whose blocks leave one partial row each.
void add_partial_column_sums(float* sums, const float* partial, int64_t chunks, int64_t cols,
                             cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
