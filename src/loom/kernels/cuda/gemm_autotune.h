#pragma once
// Timing cuBLASLt's candidate algorithms for a product once, when its plan is made (opt-in:
// LOOM_GEMM_AUTOTUNE). cuBLASLt's heuristic ranks algorithms by a model of the GPU; on some
// shapes (split-K choices for the weight gradients' long reductions, small grids) another of its
// answers runs faster. Off by default: which candidate wins can change from run to run when two
// are close, and with it the order of the fp32 additions, so results stay bit-reproducible only
// without it.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace loom::kernels::cuda {

// How many of the heuristic's answers a new plan times, read once from LOOM_GEMM_AUTOTUNE: 1
// (unset, empty or 0: the heuristic's first, nothing timed), 8 for 1, or the number given from 2
// to 32; another value is a loom::Error naming the variable and what it takes.
int gemm_autotune_candidates();
// Sets that count for plans made from now on (1 to 32; a test or benchmark comparing both); 0
// returns to LOOM_GEMM_AUTOTUNE's.
void set_gemm_autotune_candidates(int candidates);

// One product as cublasLtMatmul takes it, its output into `scratch` (C and D: the caller's output
// is not touched, but for a GELU_AUX epilogue's aux, which the descriptor points at; with beta != 0
// the scratch's own values are accumulated, at the same cost).
struct LtCall {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  const void* a_data = nullptr;
  const void* b_data = nullptr;
  float alpha = 1.0f, beta = 0.0f;
  void* scratch = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

struct TunedAlgorithm {
  int chosen = 0;          // index into the candidates
  int timed = 0;           // candidates that ran
  float first_us = 0.0f;   // the heuristic's first answer, mean microseconds per product
  float chosen_us = 0.0f;  // the chosen one's
};

// The fastest of `candidates` (the heuristic's order; the first always among them): each run once
// as a warm-up, then the mean of three runs timed by CUDA events on the call's stream. A
// candidate cuBLASLt refuses to run is skipped; if none runs, the first is chosen.
TunedAlgorithm fastest_algorithm(const LtCall& call, const std::vector<cublasLtMatmulAlgo_t>& candidates);

}  // namespace loom::kernels::cuda
