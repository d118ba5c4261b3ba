#pragma once
// cuDNN 9 loaded at run time, never linked: dlopen("libcudnn.so.9") on first use (LOOM_CUDNN_LIBRARY
// names another file), resolving the few entries of its backend (graph) API that loom calls. A
// machine without cuDNN runs loom as before; the status says why cuDNN is not there. The API is
// compiled only where cuDNN's headers were found at build time (LOOM_HAVE_CUDNN_HEADERS).
#include <mutex>
#include <string>

#ifdef LOOM_HAVE_CUDNN_HEADERS
#include <cudnn_graph.h>
#endif

namespace loom::kernels::cuda {

struct CudnnStatus {
  bool available = false;
  long version = 0;    // cudnnGetVersion(), e.g. 91900
  std::string reason;  // why not, when not available
};

// Loads once per process; never throws.
const CudnnStatus& cudnn_status();
// Whether the library at `path` would serve (loading it if so), without touching the process's
// cuDNN; never throws.
CudnnStatus cudnn_probe(const std::string& path);

#ifdef LOOM_HAVE_CUDNN_HEADERS

struct CudnnApi {
  decltype(&cudnnGetVersion) get_version;
  decltype(&cudnnGetErrorString) error_string;
  decltype(&cudnnGetLastErrorString) last_error_string;
  decltype(&cudnnCreate) create;
  decltype(&cudnnSetStream) set_stream;
  decltype(&cudnnBackendCreateDescriptor) create_descriptor;
  decltype(&cudnnBackendDestroyDescriptor) destroy_descriptor;
  decltype(&cudnnBackendSetAttribute) set_attribute;
  decltype(&cudnnBackendGetAttribute) get_attribute;
  decltype(&cudnnBackendFinalize) finalize;
  decltype(&cudnnBackendExecute) execute;
};

// The loaded entries; throws loom::Error with the status's reason when cuDNN is unavailable.
const CudnnApi& cudnn_api();

// Throws loom::Error naming `what`, the status and cuDNN's own last message unless it succeeded.
void check_cudnn(cudnnStatus_t status, const std::string& what);

// The current device's cuDNN handle, bound to `stream` and held by this object until it ends
// (make it a temporary of the call that uses it): cuDNN serves one thread at a time per handle,
// and the stream it is bound to is the handle's state, which another thread would change.
class CudnnHandle {
 public:
  explicit CudnnHandle(cudaStream_t stream);
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

#endif

}  // namespace loom::kernels::cuda
