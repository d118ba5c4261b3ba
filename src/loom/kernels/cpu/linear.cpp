#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/parallel.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "loom/kernels/column_sums.h"

namespace loom::kernels::cpu {

void linear_forward(float* out, const float* in, const float* weight, const float* bias, int64_t n,
                    int64_t in_features, int64_t out_features, bool accumulate) {
  if (n == 0 || out_features == 0) return;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if(worth_parallel(n * out_features))
    for (int64_t row = 0; row < n; ++row) {
      float* o = out + row * out_features;
      if (accumulate) {
        for (int64_t i = 0; i < out_features; ++i) o[i] += bias[i];
      } else {
        std::copy(bias, bias + out_features, o);
      }
    }
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out_features),
              static_cast<int>(in_features), 1.0f, in, static_cast<int>(in_features), weight,
              static_cast<int>(in_features), (bias != nullptr || accumulate) ? 1.0f : 0.0f, out, static_cast<int>(out_features));
}

void add_bias(float* x, const float* bias, int64_t rows, int64_t width) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * width))
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * width;
    for (int64_t i = 0; i < width; ++i) row[i] += bias[i];
  }
}

void linear_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                     const float* weight, int64_t n, int64_t in_features, int64_t out_features, bool accumulate_din,
                     bool accumulate_dweight) {
  if (n == 0) return;
  const int N = static_cast<int>(n), IC = static_cast<int>(in_features), OC = static_cast<int>(out_features);
  if (din != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, weight, IC,
                accumulate_din ? 1.0f : 0.0f, din, IC);
  }
  if (dweight != nullptr) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, in, IC,
                accumulate_dweight ? 1.0f : 0.0f, dweight, IC);
  }
  if (dbias != nullptr) add_column_sums(dbias, dout, n, out_features);
}

void add_column_sums(float* sums, const float* x, int64_t rows, int64_t cols) {
  const int64_t chunk = column_sum_chunk(rows);
  // Each thread owns a slice of the columns: deterministic, no atomics.
#pragma omp parallel if(worth_parallel(rows * cols))
  {
    const int threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t slice = (cols + threads - 1) / threads;
    const int64_t begin = std::min<int64_t>(cols, id * slice), end = std::min<int64_t>(cols, begin + slice);
    const int64_t width = end - begin, group_rows = chunk * kColumnSumChunksPerGroup;
    std::vector<float> partial(static_cast<size_t>(width)), group(static_cast<size_t>(width));
    for (int64_t group_first = 0; group_first < rows; group_first += group_rows) {
      std::fill(group.begin(), group.end(), 0.0f);
      for (int64_t first = group_first; first < std::min(rows, group_first + group_rows); first += chunk) {
        std::fill(partial.begin(), partial.end(), 0.0f);
        for (int64_t row = first; row < std::min(rows, first + chunk); ++row) {
          const float* d = x + row * cols + begin;
          for (int64_t o = 0; o < width; ++o) partial[o] += d[o];
        }
        for (int64_t o = 0; o < width; ++o) group[o] += partial[o];
      }
      for (int64_t o = 0; o < width; ++o) sums[begin + o] += group[o];
    }
  }
}

void gemm_nt(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool accumulate) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, a, static_cast<int>(k), b, static_cast<int>(k),
              accumulate ? 1.0f : 0.0f, c, static_cast<int>(n));
}

void gemm(float* c, const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
          bool accumulate) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, static_cast<int>(trans_a ? m : k),
              b, static_cast<int>(trans_b ? k : n), accumulate ? 1.0f : 0.0f, c, static_cast<int>(n));
}

}  // namespace loom::kernels::cpu
