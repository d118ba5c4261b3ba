#pragma once
// Token (and learned position) embedding lookup.
#include <cstdint>

namespace loom::kernels::cpu {

// out[r, :] = table[ids[r], :] (+= when accumulate, used to add position embeddings)
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                       bool accumulate);
// dtable[ids[r], :] += dout[r, :]. Threads split the columns, so repeated ids never race.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim);

// Vocabulary-parallel forms: `table` holds ids [first_id, first_id + count). Forward writes the
// rows whose id this shard holds and zeros the others (a sum over shards is the full lookup);
// backward adds only into the rows this shard holds.
void embedding_forward_shard(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                             int64_t first_id, int64_t count);
void embedding_backward_shard(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                              int64_t first_id, int64_t count);

}  // namespace loom::kernels::cpu
