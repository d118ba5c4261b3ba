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

// Every run gets the widest one's blocks (at most 64 for runs of at most kSharedLaunchWidth).
void launch_runs(const ZeroRunsArgs& args, int used, int64_t widest, cudaStream_t stream) {
  if (used == 0) return;
  zero_runs_kernel<<<dim3(grid_for((widest + 3) / 4), static_cast<unsigned>(used)), kThreads, 0, stream>>>(args);
  check_launch("zero_runs_kernel");
}

// A run wider than this is a memset of its own, so that the small ones (a model's norms and
// biases) do not each get the blocks of the widest (an embedding table) for nothing.
constexpr int64_t kSharedLaunchWidth = int64_t{64} * kThreads * 4;

}  // namespace

void zero_runs(float* base, const FloatRun* runs, int64_t count, cudaStream_t stream) {
  ZeroRunsArgs small{};
  small.base = base;
  int used = 0;
  int64_t widest = 0;
  for (int64_t r = 0; r < count; ++r) {
    if (runs[r].n == 0) continue;
    if (runs[r].n > kSharedLaunchWidth) {
      check_cuda(cudaMemsetAsync(base + runs[r].begin, 0, static_cast<size_t>(runs[r].n) * sizeof(float), stream),
                 "cudaMemsetAsync (a wide run)");
      continue;
    }
    small.begin[used] = runs[r].begin;
    small.n[used] = runs[r].n;
    widest = std::max(widest, runs[r].n);
    if (++used == kMaxZeroRunsPerLaunch) {
      launch_runs(small, used, widest, stream);
      used = 0;
      widest = 0;
    }
  }
  launch_runs(small, used, widest, stream);
}

}  // namespace loom::kernels::cuda
