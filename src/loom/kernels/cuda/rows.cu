#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/grouped_rows.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/rows.h"

namespace loom::kernels::cuda {

namespace {

// The element-wise kernels here run row by row (launch_over_rows): no division per element.
__global__ void add_rows_kernel(float* __restrict__ y, int64_t y_stride, const float* __restrict__ x, int64_t x_stride,
                                int64_t rows, int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < width; c += column_stride())
      y[r * y_stride + c] = __fadd_rn(y[r * y_stride + c], x[r * x_stride + c]);
  }
}

__global__ void gather_rows_kernel(float* __restrict__ out, const float* __restrict__ x,
                                   const int32_t* __restrict__ index, const float* __restrict__ scale, int64_t rows,
                                   int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t source = index ? index[r] : r;
    const float* from = x + source * width;
    for (int64_t c = column_start(); c < width; c += column_stride())
      out[r * width + c] = source < 0 ? 0.0f : scale ? __fmul_rn(scale[r], from[c]) : from[c];
  }
}

// Without an index each row has its own target: one fused multiply-add per element, so a thread
// per element gives the bits of the in-order walk.
__global__ void add_scaled_rows_kernel(float* __restrict__ out, const float* __restrict__ x, int64_t x_stride,
                                       const float* __restrict__ scale, int64_t rows, int64_t width) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float w = scale ? scale[r] : 1.0f;
    for (int64_t c = column_start(); c < width; c += column_stride())
      out[r * width + c] = __fmaf_rn(w, x[r * x_stride + c], out[r * width + c]);
  }
}

__global__ void row_dots_kernel(double* __restrict__ out, const float* __restrict__ a,
                                const int32_t* __restrict__ index, const float* __restrict__ b, int64_t b_stride,
                                int64_t rows, int64_t width) {
  for (int64_t r = grid_start(); r < rows; r += grid_stride()) {
    const float* x = a + (index ? index[r] : r) * width;
    const float* y = b + r * b_stride;
    double dot = 0.0;
    for (int64_t c = 0; c < width; ++c) dot = __fma_rn(static_cast<double>(x[c]), static_cast<double>(y[c]), dot);
    out[r] = dot;
  }
}

}  // namespace

void gather_rows(float* out, const float* x, const int32_t* index, const float* scale, int64_t rows, int64_t width,
                 cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  gather_rows_kernel<<<l.grid, l.block, 0, stream>>>(out, x, index, scale, rows, width);
  check_launch("gather_rows_kernel");
}

void scatter_add_rows(float* out, const float* x, int64_t x_stride, const int32_t* index, const float* scale,
                      int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows * width == 0) return;
  if (index == nullptr) {
    const RowsLaunch l = launch_over_rows(rows, width);
    add_scaled_rows_kernel<<<l.grid, l.block, 0, stream>>>(out, x, x_stride, scale, rows, width);
    check_launch("add_scaled_rows_kernel");
    return;
  }
  // Targets repeat: each target's rows in row order, targets in parallel (grouped_rows.h).
  add_rows_by_target(RowsByTarget{out, x, x_stride, index, scale, rows, width}, stream);
}

void row_dots(double* out, const float* a, const int32_t* index, const float* b, int64_t b_stride, int64_t rows,
              int64_t width, cudaStream_t stream) {
  if (rows == 0) return;
  row_dots_kernel<<<grid_for(rows), kThreads, 0, stream>>>(out, a, index, b, b_stride, rows, width);
  check_launch("row_dots_kernel");
}

void add_rows(float* y, int64_t y_stride, const float* x, int64_t x_stride, int64_t rows, int64_t width,
              cudaStream_t stream) {
  if (rows * width == 0) return;
  const RowsLaunch l = launch_over_rows(rows, width);
  add_rows_kernel<<<l.grid, l.block, 0, stream>>>(y, y_stride, x, x_stride, rows, width);
  check_launch("add_rows_kernel");
}

}  // namespace loom::kernels::cuda
