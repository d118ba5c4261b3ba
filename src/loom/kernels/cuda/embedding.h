#pragma once
// Embedding lookups on the device, with the contracts of kernels::cpu's (embedding.h):
//   forward:  out[r, :] = table[ids[r], :] (+= with accumulate);
//   backward: dtable[ids[r], :] += dout[r, :], the rows of an id in row order (grouped_rows.h:
//             no atomics), so bit for bit the CPU's and the same from run to run;
//   shards:   the table holds ids [first_id, first_id + count); other ids give zero rows forward
//             and nothing backward (vocabulary parallelism).
// ids live on the device.
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::kernels::cuda {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim, bool accumulate,
                       cudaStream_t stream = nullptr);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                        cudaStream_t stream = nullptr);
void embedding_forward_shard(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                             int64_t first_id, int64_t count, cudaStream_t stream = nullptr);
void embedding_backward_shard(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                              int64_t first_id, int64_t count, cudaStream_t stream = nullptr);

}  // namespace loom::kernels::cuda
