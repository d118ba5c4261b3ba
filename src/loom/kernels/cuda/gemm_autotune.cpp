#include "loom/kernels/cuda/gemm_autotune.h"

#include <cstdlib>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/process_setting.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kDefaultCandidates = 8, kMostCandidates = 32, kTimedRuns = 3;

int candidates_from_environment() {
  const char* value = std::getenv("LOOM_GEMM_AUTOTUNE");
  const std::string v = value != nullptr ? value : "";
  if (v.empty() || v == "0") return 1;
  if (v == "1") return kDefaultCandidates;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() + v.size() && n >= 2 && n <= kMostCandidates) return static_cast<int>(n);
  throw Error("LOOM_GEMM_AUTOTUNE=" + v + ": expected 0 (off), 1 (time " + std::to_string(kDefaultCandidates) +
              " of cuBLASLt's candidate algorithms per product shape) or a count from 2 to " +
              std::to_string(kMostCandidates));
}

bool run(const LtCall& call, const cublasLtMatmulAlgo_t& algo) {
  const bool ran = cublasLtMatmul(call.handle, call.desc, &call.alpha, call.a_data, call.a, call.b_data, call.b,
                                  &call.beta, call.scratch, call.c, call.scratch, call.d, &algo, call.workspace,
                                  call.workspace_bytes, call.stream) == CUBLAS_STATUS_SUCCESS;
  if (!ran) (void)cudaGetLastError();  // a refused candidate's launch error, if any, is not the caller's
  return ran;
}

// Mean microseconds of kTimedRuns runs after a warm-up; negative when cuBLASLt refuses it.
float time_us(const LtCall& call, const cublasLtMatmulAlgo_t& algo, cudaEvent_t start, cudaEvent_t stop) {
  if (!run(call, algo)) return -1.0f;
  check_cuda(cudaEventRecord(start, call.stream), "cudaEventRecord (GEMM autotune)");
  for (int i = 0; i < kTimedRuns; ++i) {
    if (!run(call, algo)) return -1.0f;
  }
  check_cuda(cudaEventRecord(stop, call.stream), "cudaEventRecord (GEMM autotune)");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize (GEMM autotune)");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime (GEMM autotune)");
  return 1e3f * ms / kTimedRuns;
}

}  // namespace

namespace {
ProcessSetting candidates_setting(candidates_from_environment);
}  // namespace

int gemm_autotune_candidates() { return candidates_setting.value(); }

void set_gemm_autotune_candidates(int candidates) {
  LOOM_CHECK(candidates >= 0 && candidates <= kMostCandidates,
             "set_gemm_autotune_candidates(" + std::to_string(candidates) + "): expected 1 (off) to " +
                 std::to_string(kMostCandidates) + ", or 0 for LOOM_GEMM_AUTOTUNE's");
  candidates_setting.set(candidates);
}

TunedAlgorithm fastest_algorithm(const LtCall& call, const std::vector<cublasLtMatmulAlgo_t>& candidates) {
  TunedAlgorithm best;
  cudaEvent_t start = nullptr, stop = nullptr;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate (GEMM autotune)");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate (GEMM autotune)");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const float us = time_us(call, candidates[i], start, stop);
    if (us < 0.0f) continue;
    if (i == 0) best.first_us = us;
    if (best.timed == 0 || us < best.chosen_us) {
      best.chosen = static_cast<int>(i);
      best.chosen_us = us;
    }
    ++best.timed;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

}  // namespace loom::kernels::cuda
