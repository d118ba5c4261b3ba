#include "loom/kernels/cpu/norm.h"
#include "loom/kernels/cpu/amax.h"
#include "loom/kernels/cpu/half_copies.h"
#include "loom/kernels/cpu/parallel.h"

#include <omp.h>

#include <cmath>
#include <vector>

namespace loom::kernels::cpu {

namespace {
// Parameter gradients are summed over rows: each thread sums its static block of rows into a
// private buffer, then the buffers are added in thread order (deterministic for a thread count).
struct PerThreadSums {
  explicit PerThreadSums(int64_t width) : width(width), buffers(omp_get_max_threads() * width, 0.0f) {}
  float* mine() { return buffers.data() + omp_get_thread_num() * width; }
  void add_into(float* target) const {
    int threads = static_cast<int>(buffers.size() / (width == 0 ? 1 : width));
    for (int t = 0; t < threads; ++t)
      for (int64_t i = 0; i < width; ++i) target[i] += buffers[t * width + i];
  }
  int64_t width;
  std::vector<float> buffers;
};
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* in, const float* weight, int64_t rows,
                     int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * dim))
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * dim;
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < dim; ++i) sum_sq += x[i] * x[i];
    float s = 1.0f / std::sqrt(sum_sq / static_cast<float>(dim) + eps);
    rstd[r] = s;
    float* y = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) y[i] = x[i] * s * weight[i];
  }
}

void rmsnorm_backward(float* din, float* dweight, const float* dout, const float* in, const float* weight,
                      const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax) {
  PerThreadSums dw(dim);
#pragma omp parallel if(worth_parallel(rows * dim))
  {
    float* my_dw = dw.mine();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * dim;
      const float* dy = dout + r * dim;
      float s = rstd[r];
      // d/dx of x*s*w: s*w*dy - x * s^3 * mean(x*w*dy)
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < dim; ++i) dot += dy[i] * weight[i] * x[i];
      float coeff = dot * s * s * s / static_cast<float>(dim);
      float* dx = din + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        dx[i] += dy[i] * weight[i] * s - x[i] * coeff;
        my_dw[i] += dy[i] * x[i] * s;
      }
    }
  }
  dw.add_into(dweight);
  if (din16 != nullptr) narrow_floats(din16, din, rows * dim, DType::BF16);
  if (din_amax != nullptr) amax_into(din_amax, din, rows * dim);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* weight,
                       const float* bias, int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if(worth_parallel(rows * dim))
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = in + r * dim;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int64_t i = 0; i < dim; ++i) m += x[i];
    m /= static_cast<float>(dim);
    float var = 0.0f;
#pragma omp simd reduction(+ : var)
    for (int64_t i = 0; i < dim; ++i) var += (x[i] - m) * (x[i] - m);
    var /= static_cast<float>(dim);
    float s = 1.0f / std::sqrt(var + eps);
    mean[r] = m;
    rstd[r] = s;
    float* y = out + r * dim;
    for (int64_t i = 0; i < dim; ++i) y[i] = (x[i] - m) * s * weight[i] + bias[i];
  }
}

void layernorm_backward(float* din, float* dweight, float* dbias, const float* dout, const float* in,
                        const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                        void* din16, float* din_amax) {
  PerThreadSums dw(dim), db(dim);
#pragma omp parallel if(worth_parallel(rows * dim))
  {
    float* my_dw = dw.mine();
    float* my_db = db.mine();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = in + r * dim;
      const float* dy = dout + r * dim;
      float m = mean[r], s = rstd[r];
      float mean_dnorm = 0.0f, mean_dnorm_xhat = 0.0f;
#pragma omp simd reduction(+ : mean_dnorm, mean_dnorm_xhat)
      for (int64_t i = 0; i < dim; ++i) {
        float xhat = (x[i] - m) * s;
        float dnorm = dy[i] * weight[i];
        mean_dnorm += dnorm;
        mean_dnorm_xhat += dnorm * xhat;
      }
      mean_dnorm /= static_cast<float>(dim);
      mean_dnorm_xhat /= static_cast<float>(dim);
      float* dx = din + r * dim;
      for (int64_t i = 0; i < dim; ++i) {
        float xhat = (x[i] - m) * s;
        float dnorm = dy[i] * weight[i];
        dx[i] += (dnorm - mean_dnorm - xhat * mean_dnorm_xhat) * s;
        my_dw[i] += dy[i] * xhat;
        my_db[i] += dy[i];
      }
    }
  }
  dw.add_into(dweight);
  db.add_into(dbias);
  if (din16 != nullptr) narrow_floats(din16, din, rows * dim, DType::BF16);
  if (din_amax != nullptr) amax_into(din_amax, din, rows * dim);
}

void rmsnorm_forward_bf16(void* out16, float* rstd, const float* in, const float* weight, int64_t rows, int64_t dim,
                          float eps) {
  std::vector<float> out(static_cast<size_t>(rows * dim));
  rmsnorm_forward(out.data(), rstd, in, weight, rows, dim, eps);
  narrow_floats(out16, out.data(), rows * dim, DType::BF16);
}

void layernorm_forward_bf16(void* out16, float* mean, float* rstd, const float* in, const float* weight,
                            const float* bias, int64_t rows, int64_t dim, float eps) {
  std::vector<float> out(static_cast<size_t>(rows * dim));
  layernorm_forward(out.data(), mean, rstd, in, weight, bias, rows, dim, eps);
  narrow_floats(out16, out.data(), rows * dim, DType::BF16);
}

namespace {
std::vector<float> widened(const void* x16, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  widen_floats(x.data(), x16, n, DType::BF16, false);
  return x;
}

// sum = residual + add16 widened, one fp32 rounding per element.
void add_widened(float* sum, const float* residual, const void* add16, int64_t n) {
  const std::vector<float> add = widened(add16, n);
#pragma omp parallel for simd schedule(static) if(worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) sum[i] = residual[i] + add[i];
}
}  // namespace

void rmsnorm_add_forward_bf16(void* out16, float* rstd, float* sum, const float* residual, const void* add16,
                              const float* weight, int64_t rows, int64_t dim, float eps) {
  add_widened(sum, residual, add16, rows * dim);
  rmsnorm_forward_bf16(out16, rstd, sum, weight, rows, dim, eps);
}

void layernorm_add_forward_bf16(void* out16, float* mean, float* rstd, float* sum, const float* residual,
                                const void* add16, const float* weight, const float* bias, int64_t rows, int64_t dim,
                                float eps) {
  add_widened(sum, residual, add16, rows * dim);
  layernorm_forward_bf16(out16, mean, rstd, sum, weight, bias, rows, dim, eps);
}

void rmsnorm_backward_bf16(float* din, float* dweight, const void* dout16, const float* in, const float* weight,
                           const float* rstd, int64_t rows, int64_t dim, void* din16, float* din_amax) {
  rmsnorm_backward(din, dweight, widened(dout16, rows * dim).data(), in, weight, rstd, rows, dim, din16, din_amax);
}

void layernorm_backward_bf16(float* din, float* dweight, float* dbias, const void* dout16, const float* in,
                             const float* weight, const float* mean, const float* rstd, int64_t rows, int64_t dim,
                             void* din16, float* din_amax) {
  layernorm_backward(din, dweight, dbias, widened(dout16, rows * dim).data(), in, weight, mean, rstd, rows, dim,
                     din16, din_amax);
}

}  // namespace loom::kernels::cpu
