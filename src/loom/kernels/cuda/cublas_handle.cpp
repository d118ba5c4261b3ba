#include "loom/kernels/cuda/cublas_handle.h"

#include <memory>

#include "loom/core/error.h"
#include "loom/kernels/cuda/per_device.h"

namespace loom::kernels::cuda {

std::string cublas_status_text(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")";
}

void CublasHandle::bind(cudaStream_t stream) {
  cublasStatus_t status = cublasSetStream(handle, stream);  // which resets the workspace: set after
  if (status == CUBLAS_STATUS_SUCCESS) status = cublasSetWorkspace(handle, workspaces.get(stream), workspaces.bytes());
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error("cuBLAS: setting the stream and workspace failed: " + cublas_status_text(status));
}

CublasHandle& cublas_handle() {
  return current_device_object<CublasHandle>("cuBLAS handle", [] {
    auto made = std::make_unique<CublasHandle>();
    const cublasStatus_t created = cublasCreate(&made->handle);
    if (created != CUBLAS_STATUS_SUCCESS) throw Error("cuBLAS: cublasCreate failed: " + cublas_status_text(created));
    return made;
  });
}

}  // namespace loom::kernels::cuda
