#include <cub/device/device_radix_sort.cuh>

#include <limits>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/grouped_rows.h"
#include "loom/kernels/cuda/launch.cuh"

namespace loom::kernels::cuda {

namespace {

__global__ void row_numbers_kernel(int32_t* __restrict__ rows_out, int64_t rows) {
  for (int64_t r = grid_start(); r < rows; r += grid_stride()) rows_out[r] = static_cast<int32_t>(r);
}

// Block row p handles the group of equal targets that starts at sorted position p (other
// positions return at once): each thread a column, its rows in row order (the sort is stable).
__global__ void add_groups_kernel(RowsByTarget a, const int32_t* __restrict__ sorted_targets,
                                  const int32_t* __restrict__ sorted_rows) {
  for (int64_t p = blockIdx.y; p < a.rows; p += gridDim.y) {
    const int32_t target = sorted_targets[p];
    if (p > 0 && sorted_targets[p - 1] == target) continue;
    const int64_t local = static_cast<int64_t>(target) - a.first;
    if (local < 0 || local >= a.count) continue;
    int64_t end = p + 1;
    while (end < a.rows && sorted_targets[end] == target) ++end;
    float* to = a.out + local * a.width;
    for (int64_t c = column_start(); c < a.width; c += column_stride()) {
      float sum = to[c];
      for (int64_t q = p; q < end; ++q) {
        const int64_t r = sorted_rows[q];
        const float v = a.x[r * a.x_stride + c];
        sum = a.scale ? __fmaf_rn(a.scale[r], v, sum) : __fadd_rn(sum, v);
      }
      to[c] = sum;
    }
  }
}

}  // namespace

void add_rows_by_target(const RowsByTarget& a, cudaStream_t stream) {
  if (a.rows == 0 || a.width == 0) return;
  LOOM_CHECK(a.rows <= std::numeric_limits<int32_t>::max(),
             "add_rows_by_target: " + std::to_string(a.rows) + " rows (at most 2^31 - 1 are sorted)");
  const int n = static_cast<int>(a.rows);
  // One allocation: rows in, then sorted targets and sorted rows, then CUB's temporary storage.
  size_t sort_bytes = 0;
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, a.targets, static_cast<int32_t*>(nullptr),
                                             static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n,
                                             0, 32, stream),
             "cub::DeviceRadixSort::SortPairs (size)");
  const size_t index_bytes = (static_cast<size_t>(n) * sizeof(int32_t) + 255) / 256 * 256;
  char* scratch = nullptr;
  check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&scratch), 3 * index_bytes + sort_bytes, stream),
             "cudaMallocAsync");
  int32_t* rows_in = reinterpret_cast<int32_t*>(scratch);
  int32_t* sorted_targets = reinterpret_cast<int32_t*>(scratch + index_bytes);
  int32_t* sorted_rows = reinterpret_cast<int32_t*>(scratch + 2 * index_bytes);
  row_numbers_kernel<<<grid_for(a.rows), kThreads, 0, stream>>>(rows_in, a.rows);
  check_launch("row_numbers_kernel");
  check_cuda(cub::DeviceRadixSort::SortPairs(scratch + 3 * index_bytes, sort_bytes, a.targets, sorted_targets, rows_in,
                                             sorted_rows, n, 0, 32, stream),
             "cub::DeviceRadixSort::SortPairs");
  const RowsLaunch l = launch_over_rows(a.rows, a.width);
  add_groups_kernel<<<l.grid, l.block, 0, stream>>>(a, sorted_targets, sorted_rows);
  check_launch("add_groups_kernel");
  check_cuda(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
}

}  // namespace loom::kernels::cuda
