#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/parallel.h"

#include <omp.h>

#include <algorithm>

namespace loom::kernels::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                       bool accumulate) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * dim))
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = table + static_cast<int64_t>(ids[r]) * dim;
    float* dst = out + r * dim;
    if (accumulate) {
      for (int64_t i = 0; i < dim; ++i) dst[i] += src[i];
    } else {
      std::copy(src, src + dim, dst);
    }
  }
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim) {
#pragma omp parallel if(worth_parallel(rows * dim))
  {
    int threads = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t chunk = (dim + threads - 1) / threads;
    int64_t begin = std::min<int64_t>(dim, id * chunk), end = std::min<int64_t>(dim, begin + chunk);
    for (int64_t r = 0; r < rows; ++r) {
      float* dst = dtable + static_cast<int64_t>(ids[r]) * dim;
      const float* src = dout + r * dim;
      for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
    }
  }
}

void embedding_forward_shard(float* out, const int32_t* ids, const float* table, int64_t rows, int64_t dim,
                             int64_t first_id, int64_t count) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * dim))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t local = static_cast<int64_t>(ids[r]) - first_id;
    float* dst = out + r * dim;
    if (local >= 0 && local < count) {
      std::copy(table + local * dim, table + (local + 1) * dim, dst);
    } else {
      std::fill(dst, dst + dim, 0.0f);
    }
  }
}

void embedding_backward_shard(float* dtable, const float* dout, const int32_t* ids, int64_t rows, int64_t dim,
                              int64_t first_id, int64_t count) {
#pragma omp parallel if(worth_parallel(rows * dim))
  {
    int threads = omp_get_num_threads(), id = omp_get_thread_num();
    int64_t chunk = (dim + threads - 1) / threads;
    int64_t begin = std::min<int64_t>(dim, id * chunk), end = std::min<int64_t>(dim, begin + chunk);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t local = static_cast<int64_t>(ids[r]) - first_id;
      if (local < 0 || local >= count) continue;
      float* dst = dtable + local * dim;
      const float* src = dout + r * dim;
      for (int64_t i = begin; i < end; ++i) dst[i] += src[i];
    }
  }
}

}  // namespace loom::kernels::cpu
