#pragma once
// Token (and learned position) embedding lookup.
#include <cstdint>

namespace loom::kernels::cpu {

// out[r, :] = table[ids[r], :] (+= when accumulate, used to add position embeddings)
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                       bool accumulate);
// dtable[ids[r], :] += dout[r, :]. Threads split the columns, so repeated ids never race.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim);

}  // namespace loom::kernels::cpu
