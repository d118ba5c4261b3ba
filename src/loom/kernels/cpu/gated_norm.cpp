#include "loom/kernels/cpu/gated_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/kernels/cpu/fast_math.h"

namespace loom::kernels::cpu {
namespace {

// Columns of the weight gradient one thread sums over every row (each column's rows in order).
constexpr int64_t kColumnBlock = 64;

}  // namespace

void gated_rmsnorm_forward(float* out, float* rstd, const float* y, const float* z, int64_t z_stride,
                           const float* weight, int64_t rows, int64_t dim, int64_t group_size, float eps) {
  const int64_t groups = dim / group_size;
#pragma omp parallel
  {
    std::vector<double> gated(static_cast<size_t>(group_size));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * group_size;
        const float* yr = y + r * dim + c0;
        const float* zr = z + r * z_stride + c0;
        double squares = 0.0;
#pragma omp simd reduction(+ : squares)
        for (int64_t i = 0; i < group_size; ++i) {
          const double zc = zr[i], value = yr[i] * zc * fast_sigmoid(zc);
          gated[i] = value;
          squares += value * value;
        }
        const double scale = 1.0 / std::sqrt(squares / static_cast<double>(group_size) + eps);
        rstd[r * groups + g] = static_cast<float>(scale);
        float* o = out + r * dim + c0;
#pragma omp simd
        for (int64_t i = 0; i < group_size; ++i) o[i] = static_cast<float>(gated[i] * scale * weight[c0 + i]);
      }
    }
  }
}

void gated_rmsnorm_backward(float* dy, float* dz, float* dweight, const float* dout, const float* y, const float* z,
                            int64_t z_stride, const float* weight, const float* rstd, int64_t rows, int64_t dim,
                            int64_t group_size) {
  const int64_t groups = dim / group_size;
#pragma omp parallel
  {
    std::vector<double> gate(static_cast<size_t>(group_size)), gated(static_cast<size_t>(group_size));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t c0 = g * group_size;
        const float* yr = y + r * dim + c0;
        const float* zr = z + r * z_stride + c0;
        const float* dr = dout + r * dim + c0;
        const double scale = rstd[r * groups + g];
        double mean_dot = 0.0;  // mean over the group of d(out)/d(normalised) * gated
#pragma omp simd reduction(+ : mean_dot)
        for (int64_t i = 0; i < group_size; ++i) {
          const double zc = zr[i];
          gate[i] = fast_sigmoid(zc);
          gated[i] = yr[i] * zc * gate[i];
          mean_dot += static_cast<double>(dr[i]) * weight[c0 + i] * gated[i];
        }
        mean_dot /= static_cast<double>(group_size);
        float* dyr = dy + r * dim + c0;
        float* dzr = dz + r * z_stride + c0;
#pragma omp simd
        for (int64_t i = 0; i < group_size; ++i) {
          const double zc = zr[i], sz = gate[i], silu = zc * sz;
          const double dgated = scale * (dr[i] * weight[c0 + i] - gated[i] * scale * scale * mean_dot);
          dyr[i] += static_cast<float>(dgated * silu);
          dzr[i] += static_cast<float>(dgated * yr[i] * sz * (1.0 + zc * (1.0 - sz)));
        }
      }
    }
  }
  // Parameter gradient: parallel over blocks of adjacent channels, each channel's rows summed in
  // order.
  const int64_t blocks = (dim + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock, width = std::min(kColumnBlock, dim - c0);
    double sums[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = y + r * dim + c0;
      const float* zr = z + r * z_stride + c0;
      const float* dr = dout + r * dim + c0;
      const float* scales = rstd + r * groups;
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) {
        const double zc = zr[i], gated = yr[i] * zc * fast_sigmoid(zc);
        sums[i] += static_cast<double>(dr[i]) * gated * scales[(c0 + i) / group_size];
      }
    }
    for (int64_t i = 0; i < width; ++i) dweight[c0 + i] += static_cast<float>(sums[i]);
  }
}

}  // namespace loom::kernels::cpu
