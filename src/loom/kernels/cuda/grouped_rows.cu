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

// The end of the group of equal targets starting at sorted position p: the first later position
// with another target. Galloping from p (p + 1, p + 2, p + 4, ... until a position holds another
// target or passes the end), then a binary search within the last step: about 2 log2 of the
// group's length in dependent loads, not log2 of all the rows for every group (most groups are a
// row or two; a frequent id's may hold thousands).
__device__ inline int64_t group_end(const int32_t* __restrict__ sorted_targets, int64_t p, int64_t rows) {
  const int32_t target = sorted_targets[p];
  int64_t lo = p + 1, hi = p + 1, step = 1;  // sorted_targets[lo - 1] == target
  while (hi < rows && sorted_targets[hi] == target) {
    lo = hi + 1;
    step *= 2;
    hi = p + step;  // at least lo
  }
  hi = hi < rows ? hi : rows;  // the end lies in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted_targets[mid] == target) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// Rows of a group loaded this many at a time before they are added in order: their loads are
// independent, so a thread keeps several in flight instead of waiting on each (a frequent id's
// group is a long walk for its few blocks).
constexpr int kRowsInFlight = 8;

// Block row p handles the group of equal targets that starts at sorted position p (other
// positions return at once): each thread a column, its rows in row order (the sort is stable).
__global__ void add_groups_kernel(RowsByTarget a, const int32_t* __restrict__ sorted_targets,
                                  const int32_t* __restrict__ sorted_rows) {
  for (int64_t p = blockIdx.y; p < a.rows; p += gridDim.y) {
    const int32_t target = sorted_targets[p];
    if (p > 0 && sorted_targets[p - 1] == target) continue;
    const int64_t local = static_cast<int64_t>(target) - a.first;
    if (local < 0 || local >= a.count) continue;
    const int64_t end = group_end(sorted_targets, p, a.rows);
    float* to = a.out + local * a.width;
    for (int64_t c = column_start(); c < a.width; c += column_stride()) {
      float sum = to[c];
      int64_t q = p;
      for (; q + kRowsInFlight <= end; q += kRowsInFlight) {
        float v[kRowsInFlight], w[kRowsInFlight];
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) {
          const int64_t r = sorted_rows[q + i];
          v[i] = a.x[r * a.x_stride + c];
          w[i] = a.scale ? a.scale[r] : 1.0f;
        }
#pragma unroll
        for (int i = 0; i < kRowsInFlight; ++i) sum = a.scale ? __fmaf_rn(w[i], v[i], sum) : __fadd_rn(sum, v[i]);
      }
      for (; q < end; ++q) {
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
