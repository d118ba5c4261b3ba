// The host half of an offloaded optimizer (optim.cpu_offload, optim/host_offload.h): AdamW's
// update of N fp32 elements on the host's cores (kernels::adamw_update on Device::cpu(), the update
// HostOffloadedOptimizer runs), the median of REPEATS timed updates after one untimed, in ms and in
// GB/s of the 28 bytes an element moves (value, gradient and two moments read; value and moments
// written). bench/host_adamw_vs_torch.sh runs it beside PyTorch's CPU AdamW on the same sizes.
//
// Usage: loom_bench_host_adamw N [REPEATS=5] [THREADS=0: OpenMP's default]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loom/kernels/ops.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s N [REPEATS=5] [THREADS=0]\n", argv[0]);
    return 2;
  }
  const int64_t n = std::atoll(argv[1]);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  if (n <= 0 || repeats <= 0 || threads < 0) {
    std::fprintf(stderr, "error: N and REPEATS must be positive and THREADS at least 0\n");
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  std::vector<float> param(static_cast<size_t>(n)), grad(param.size()), m(param.size()), v(param.size());
  for (int64_t i = 0; i < n; ++i) {
    param[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i % 97 - 48);
    grad[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i % 89 - 44);
  }
  std::vector<double> ms;
  for (int r = 0; r <= repeats; ++r) {
    const loom::kernels::AdamWStep step{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, r + 1, 1.0f};
    const auto start = std::chrono::steady_clock::now();
    loom::kernels::adamw_update(loom::Device::cpu(), param.data(), grad.data(), m.data(), v.data(), n, step);
    const double elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (r > 0) ms.push_back(elapsed);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("HOST_ADAMW engine=loom n=%lld threads=%d ms=%.3f gbs=%.2f\n", static_cast<long long>(n),
              omp_get_max_threads(), median, 28.0 * static_cast<double>(n) / (median * 1e6));
  return 0;
}
