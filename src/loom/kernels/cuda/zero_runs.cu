#include <algorithm>

#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/launch.cuh"
#include "loom/kernels/cuda/zero_runs.h"

namespace loom::kernels::cuda {

namespace {

struct ZeroRunsArgs {
  float* base;
  int64_t begin[kMaxZeroRunsPerLaunch];
  int64_t n[kMaxZeroRunsPerLaunch];
};
static_assert(sizeof(ZeroRunsArgs) <= 4096, "a kernel's arguments are at most 4 KB");

// Run blockIdx.y: its elements before the first 16-byte boundary, then 16-byte stores over the
// grid, then the elements after the last whole pack.
__global__ void zero_runs_kernel(ZeroRunsArgs args) {
  float* run = args.base + args.begin[blockIdx.y];
  const int64_t n = args.n[blockIdx.y];
  const int64_t misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(run) & 15) / 4;
  const int64_t head = min(n, (4 - misaligned) & 3);
  const int64_t packs = (n - head) / 4, tail = head + packs * 4;
  const int64_t t = grid_start();
  if (t < head) run[t] = 0.0f;
  float4* body = reinterpret_cast<float4*>(run + head);
  for (int64_t i = t; i < packs; i += grid_stride()) body[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (t < n - tail) run[tail + t] = 0.0f;
}

}  // namespace

void zero_runs(float* base, const FloatRun* runs, int64_t count, cudaStream_t stream) {
  for (int64_t first = 0; first < count; first += kMaxZeroRunsPerLaunch) {
    ZeroRunsArgs args{};
    args.base = base;
    int used = 0;
    int64_t widest = 0;
    for (int64_t r = first; r < std::min<int64_t>(count, first + kMaxZeroRunsPerLaunch); ++r) {
      if (runs[r].n == 0) continue;
      args.begin[used] = runs[r].begin;
      args.n[used] = runs[r].n;
      widest = std::max(widest, runs[r].n);
      ++used;
    }
    if (used == 0) continue;
    // Blocks enough for the widest run's packs (at most 2048 a run: the grid-stride loop does the rest).
    const unsigned blocks = std::min<unsigned>(2048, grid_for((widest + 3) / 4));
    zero_runs_kernel<<<dim3(blocks, static_cast<unsigned>(used)), kThreads, 0, stream>>>(args);
    check_launch("zero_runs_kernel");
  }
}

}  // namespace loom::kernels::cuda
