#pragma once
// One cuBLAS handle per GPU, for the products cuBLASLt does not serve (the MoE layers' grouped
// GEMMs, the chunked scan's batched DGEMMs): its calls serialised by `mutex`, each stream its
// products run on given a workspace of its own (stream_workspaces.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <string>

#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/stream_workspaces.h"

namespace loom::kernels::cuda {

struct CublasHandle {
  std::mutex mutex;
  cublasHandle_t handle = nullptr;
  CachingAllocator allocator;
  StreamWorkspaces workspaces{allocator, size_t{32} << 20};

  // Points the handle's next calls at `stream` and that stream's workspace; `mutex` held.
  void bind(cudaStream_t stream);
};

// The current device's, made on first use.
CublasHandle& cublas_handle();

// "CUBLAS_STATUS_... (its description)".
std::string cublas_status_text(cublasStatus_t status);

}  // namespace loom::kernels::cuda
