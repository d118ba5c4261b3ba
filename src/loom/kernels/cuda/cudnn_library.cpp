#include "loom/kernels/cuda/cudnn_library.h"

#ifdef LOOM_HAVE_CUDNN_HEADERS
#include <dlfcn.h>

#include <cstdlib>
#include <memory>

#include "loom/core/error.h"
#include "loom/kernels/cuda/per_device.h"
#endif

namespace loom::kernels::cuda {

#ifndef LOOM_HAVE_CUDNN_HEADERS

const CudnnStatus& cudnn_status() {
  static const CudnnStatus status = cudnn_probe("");
  return status;
}

CudnnStatus cudnn_probe(const std::string&) {
  return CudnnStatus{false, 0, "loom was built without cuDNN's headers (cudnn_graph.h)"};
}

#else

namespace {

struct Loaded {
  CudnnStatus status;
  CudnnApi api{};
};

template <typename F>
bool resolve(void* library, const char* name, F& entry, std::string& missing) {
  entry = reinterpret_cast<F>(dlsym(library, name));
  if (entry == nullptr && missing.empty()) missing = name;
  return entry != nullptr;
}

Loaded load(const std::string& path) {
  Loaded loaded;
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    loaded.status.reason = "dlopen(\"" + path + "\") failed: " + (why != nullptr ? why : "no reason given");
    return loaded;
  }
  CudnnApi& a = loaded.api;
  std::string missing;
  resolve(library, "cudnnGetVersion", a.get_version, missing);
  resolve(library, "cudnnGetErrorString", a.error_string, missing);
  resolve(library, "cudnnGetLastErrorString", a.last_error_string, missing);
  resolve(library, "cudnnCreate", a.create, missing);
  resolve(library, "cudnnSetStream", a.set_stream, missing);
  resolve(library, "cudnnBackendCreateDescriptor", a.create_descriptor, missing);
  resolve(library, "cudnnBackendDestroyDescriptor", a.destroy_descriptor, missing);
  resolve(library, "cudnnBackendSetAttribute", a.set_attribute, missing);
  resolve(library, "cudnnBackendGetAttribute", a.get_attribute, missing);
  resolve(library, "cudnnBackendFinalize", a.finalize, missing);
  resolve(library, "cudnnBackendExecute", a.execute, missing);
  if (!missing.empty()) {
    loaded.status.reason = path + " lacks " + missing + " (cuDNN 9's backend API is needed)";
    return loaded;
  }
  loaded.status.version = static_cast<long>(a.get_version());
  if (loaded.status.version / 10000 != 9) {
    loaded.status.reason = path + " is cuDNN " + std::to_string(loaded.status.version) + "; loom needs cuDNN 9";
    return loaded;
  }
  loaded.status.available = true;  // the library stays loaded for the process's life
  return loaded;
}

const Loaded& loaded() {
  static const Loaded* l = [] {
    const char* named = std::getenv("LOOM_CUDNN_LIBRARY");
    return new Loaded(load(named != nullptr && *named != '\0' ? named : "libcudnn.so.9"));
  }();
  return *l;
}

struct Handle {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
};

}  // namespace

const CudnnStatus& cudnn_status() { return loaded().status; }

CudnnStatus cudnn_probe(const std::string& path) { return load(path).status; }

const CudnnApi& cudnn_api() {
  const Loaded& l = loaded();
  LOOM_CHECK(l.status.available, "cuDNN is unavailable: " + l.status.reason);
  return l.api;
}

void check_cudnn(cudnnStatus_t status, const std::string& what) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const CudnnApi& a = cudnn_api();
  char message[1024] = {0};
  a.last_error_string(message, sizeof(message));
  throw Error("cuDNN: " + what + " failed: " + a.error_string(status) +
              (message[0] != '\0' ? std::string(" (") + message + ")" : std::string()));
}

CudnnHandle::CudnnHandle(cudaStream_t stream) {
  Handle& h = current_device_object<Handle>("cuDNN handle", [] {
    auto made = std::make_unique<Handle>();
    check_cudnn(cudnn_api().create(&made->handle), "cudnnCreate");
    return made;
  });
  lock_ = std::unique_lock<std::mutex>(h.mutex);
  check_cudnn(cudnn_api().set_stream(h.handle, stream), "cudnnSetStream");
  handle_ = h.handle;
}

#endif

}  // namespace loom::kernels::cuda
