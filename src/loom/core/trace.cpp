#include "loom/core/trace.h"

#include <cstdio>

#ifdef LOOM_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace loom::trace {

namespace {

thread_local Sink* t_sink = nullptr;

#ifdef LOOM_HAVE_NVTX
nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t handle = nvtxDomainCreateA("loom");
  return handle;
}

void nvtx_push(const char* name) {
  nvtxEventAttributes_t attributes{};
  attributes.version = NVTX_VERSION;
  attributes.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attributes.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attributes.message.ascii = name;
  nvtxDomainRangePushEx(domain(), &attributes);
}

void nvtx_pop() { nvtxDomainRangePop(domain()); }
#else
void nvtx_push(const char*) {}
void nvtx_pop() {}
#endif

}  // namespace

Sink* set_thread_sink(Sink* sink) {
  Sink* previous = t_sink;
  t_sink = sink;
  return previous;
}

Range::Range(const char* what, int64_t index, const char* suffix) : sink_(t_sink) {
  char name[64];
  if (index < 0 && suffix == nullptr) {
    std::snprintf(name, sizeof(name), "%s", what);
  } else if (suffix == nullptr) {
    std::snprintf(name, sizeof(name), "%s %lld", what, static_cast<long long>(index));
  } else {
    std::snprintf(name, sizeof(name), "%s %lld %s", what, static_cast<long long>(index), suffix);
  }
  nvtx_push(name);
  if (sink_ != nullptr) sink_->open(name);
}

void Range::end() {
  if (!open_) return;
  open_ = false;
  // The sink the range opened in closes it, even if the thread's sink changed meanwhile.
  if (sink_ != nullptr) sink_->close();
  nvtx_pop();
}

}  // namespace loom::trace
