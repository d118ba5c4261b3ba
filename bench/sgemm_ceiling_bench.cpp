// The machine's sgemm ceiling: GFLOP/s of a square OpenBLAS sgemm, the yardstick for how much
// of the hardware a training step uses.   loom_bench_sgemm [N] [repeats]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "loom/core/blas_cpu.h"

int main(int argc, char** argv) {
  loom::ensure_openblas_coretype(argv);
  const int n = argc > 1 ? std::atoi(argv[1]) : 2048;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 10;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  std::vector<double> times;
  for (int r = 0; r < repeats + 2; ++r) {
    auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  std::printf("sgemm n=%d threads=%d coretype=%s median_ms=%.2f gflops_per_s=%.1f\n", n, openblas_get_num_threads(),
              core ? core : "(auto)", times[times.size() / 2] * 1e3, 2.0 * n * n * n / times[times.size() / 2] / 1e9);
  return 0;
}
