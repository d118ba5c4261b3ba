#include "loom/kernels/cuda/bias.h"

#include <cuda_bf16.h>

#include <string>

#include "loom/core/error.h"
#include "loom/kernels/column_sums.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/scratch.h"

namespace loom::kernels::cuda {

namespace {

// Row by row (launch_over_rows): the bias's column needs no division.
__global__ void broadcast_bias_kernel(float* out, const float* bias, int64_t rows, int64_t cols, bool accumulate) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    for (int64_t c = column_start(); c < cols; c += column_stride()) {
      const int64_t k = r * cols + c;
      out[k] = accumulate ? out[k] + bias[c] : bias[c];
    }
  }
}

__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// partial[k, c] = the sum of x[r, c] over chunk k's rows, in row order from zero.
template <typename T>
__global__ void chunk_column_sums_kernel(float* __restrict__ partial, const T* __restrict__ x, int64_t rows,
                                         int64_t cols, int64_t chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, k = blockIdx.y;
  if (c >= cols) return;
  const int64_t last = min(rows, (k + 1) * chunk);
  float s = 0.0f;
  for (int64_t r = k * chunk; r < last; ++r) s = __fadd_rn(s, as_float(x[r * cols + c]));
  partial[k * cols + c] = s;
}

// The same over bf16 values two columns per thread (one 4-byte load per row), each column's sum
// in the same order: the same bits, with each warp reading 128 bytes of a row rather than 64.
__global__ void chunk_column_pair_sums_kernel(float* __restrict__ partial, const __nv_bfloat162* __restrict__ x,
                                              int64_t rows, int64_t pairs, int64_t chunk) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, k = blockIdx.y;
  if (c >= pairs) return;
  const int64_t last = min(rows, (k + 1) * chunk);
  float low = 0.0f, high = 0.0f;
  for (int64_t r = k * chunk; r < last; ++r) {
    const float2 v = __bfloat1622float2(x[r * pairs + c]);
    low = __fadd_rn(low, v.x);
    high = __fadd_rn(high, v.y);
  }
  partial[k * 2 * pairs + 2 * c] = low;
  partial[k * 2 * pairs + 2 * c + 1] = high;
}

template <typename T>
void add_column_sums_of(float* sums, const T* x, int64_t rows, int64_t cols, cudaStream_t stream, const char* what) {
  if (rows * cols == 0) return;
  const ColumnChunks l = column_chunks(rows, cols, what);
  Scratch scratch;
  float* partial = scratch.floats(l.chunks * cols);
  chunk_column_sums_kernel<T><<<l.grid, kThreads, 0, stream>>>(partial, x, rows, cols, l.chunk);
  check_launch("chunk_column_sums_kernel");
  add_partial_column_sums(sums, partial, l.chunks, cols, stream);
}

// A block of 32 columns x 32 groups: thread (g, c) sums group g's chunk sums in order from zero;
// then thread (0, c) adds the groups' sums in order into sums[c].
constexpr int kGroupTile = 32;
static_assert(kGroupTile == kColumnSumChunks / kColumnSumChunksPerGroup, "one thread row per group");

__global__ void add_chunk_sums_kernel(float* __restrict__ sums, const float* __restrict__ partial, int64_t chunks,
                                      int64_t cols) {
  __shared__ float group_sums[kGroupTile][kGroupTile + 1];
  const int64_t c = blockIdx.x * static_cast<int64_t>(kGroupTile) + threadIdx.x;
  const int64_t g = threadIdx.y, groups = (chunks + kColumnSumChunksPerGroup - 1) / kColumnSumChunksPerGroup;
  if (c < cols && g < groups) {
    const int64_t last = min(chunks, (g + 1) * kColumnSumChunksPerGroup);
    float s = 0.0f;
    for (int64_t k = g * kColumnSumChunksPerGroup; k < last; ++k) s = __fadd_rn(s, partial[k * cols + c]);
    group_sums[threadIdx.y][threadIdx.x] = s;
  }
  __syncthreads();
  if (c >= cols || threadIdx.y != 0) return;
  float total = sums[c];
  for (int64_t k = 0; k < groups; ++k) total = __fadd_rn(total, group_sums[k][threadIdx.x]);
  sums[c] = total;
}

}  // namespace

void broadcast_bias(float* out, const float* bias, int64_t rows, int64_t cols, bool accumulate, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const RowsLaunch l = launch_over_rows(rows, cols);
  broadcast_bias_kernel<<<l.grid, l.block, 0, stream>>>(out, bias, rows, cols, accumulate);
  check_launch("broadcast_bias_kernel");
}

ColumnChunks column_chunks(int64_t rows, int64_t cols, const char* what) {
  const int64_t chunk = column_sum_chunk(rows), chunks = (rows + chunk - 1) / chunk;
  const int64_t column_blocks = (cols + kThreads - 1) / kThreads;
  LOOM_CHECK(column_blocks < (int64_t{1} << 31) && chunks <= kColumnSumChunks,
             std::string(what) + ": " + std::to_string(rows) + " x " + std::to_string(cols) + " exceeds one grid");
  return {chunk, chunks, dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks))};
}

void add_column_sums(float* sums, const float* x, int64_t rows, int64_t cols, cudaStream_t stream) {
  add_column_sums_of(sums, x, rows, cols, stream, "cuda::add_column_sums");
}

void add_column_sums_bf16(float* sums, const void* x16, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols % 2 != 0 || reinterpret_cast<uintptr_t>(x16) % 4 != 0) {
    add_column_sums_of(sums, static_cast<const __nv_bfloat16*>(x16), rows, cols, stream, "cuda::add_column_sums_bf16");
    return;
  }
  if (rows * cols == 0) return;
  const ColumnChunks l = column_chunks(rows, cols / 2, "cuda::add_column_sums_bf16");
  Scratch scratch;
  float* partial = scratch.floats(l.chunks * cols);
  chunk_column_pair_sums_kernel<<<l.grid, kThreads, 0, stream>>>(
      partial, static_cast<const __nv_bfloat162*>(x16), rows, cols / 2, l.chunk);
  check_launch("chunk_column_pair_sums_kernel");
  add_partial_column_sums(sums, partial, l.chunks, cols, stream);
}

void add_partial_column_sums(float* sums, const float* partial, int64_t chunks, int64_t cols, cudaStream_t stream) {
  if (chunks * cols == 0) return;
  LOOM_CHECK(chunks <= kColumnSumChunks, "cuda::add_partial_column_sums: " + std::to_string(chunks) +
                                             " partial rows, at most " + std::to_string(kColumnSumChunks));
  const int64_t tiles = (cols + kGroupTile - 1) / kGroupTile;
  add_chunk_sums_kernel<<<static_cast<unsigned>(tiles), dim3(kGroupTile, kGroupTile), 0, stream>>>(sums, partial, chunks,
                                                                                                     cols);
  check_launch("add_chunk_sums_kernel");
}

}  // namespace loom::kernels::cuda
