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

}  // namespace loom::kernels::cpu
