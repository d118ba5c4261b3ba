#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/embedding.h"
#include "loom/kernels/cuda/grouped_rows.h"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace {

// Row by row over the tokens (launch_over_rows: no division per element). A shard keeps ids in
// [first_id, first_id + count); the whole table is the shard [0, INT64_MAX).
__global__ void embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ ids,
                                         const float* __restrict__ table, int64_t rows, int64_t dim, int64_t first_id,
                                         int64_t count, bool accumulate) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t local = static_cast<int64_t>(ids[r]) - first_id;
    const bool held = local >= 0 && local < count;
    for (int64_t i = column_start(); i < dim; i += column_stride()) {
      const float value = held ? table[local * dim + i] : 0.0f;
      const int64_t k = r * dim + i;
      out[k] = accumulate ? out[k] + value : value;
    }
  }
}

constexpr int64_t kWholeTable = INT64_MAX;

void forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim, int64_t first_id,
             int64_t count, bool accumulate, cudaStream_t stream) {
  if (rows * dim == 0) return;
  const RowsLaunch l = launch_over_rows(rows, dim);
  embedding_forward_kernel<<<l.grid, l.block, 0, stream>>>(out, ids, table, rows, dim, first_id, count, accumulate);
  check_launch("embedding_forward_kernel");
}

void backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim, int64_t first_id,
              int64_t count, cudaStream_t stream) {
  // Each id's rows added in row order by one thread per column: the CPU's bits, no atomics.
  add_rows_by_target(RowsByTarget{dtable, dout, dim, ids, nullptr, rows, dim, first_id, count}, stream);
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim, bool accumulate,
                       cudaStream_t stream) {
  forward(out, ids, table, rows, dim, 0, kWholeTable, accumulate, stream);
}
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                        cudaStream_t stream) {
  backward(dtable, dout, ids, rows, dim, 0, kWholeTable, stream);
}
void embedding_forward_shard(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                             int64_t first_id, int64_t count, cudaStream_t stream) {
  forward(out, ids, table, rows, dim, first_id, count, false, stream);
}
void embedding_backward_shard(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                              int64_t first_id, int64_t count, cudaStream_t stream) {
  backward(dtable, dout, ids, rows, dim, first_id, count, stream);
}

}  // namespace loom::kernels::cuda
