#include "loom/kernels/cuda/stream_event.h"

#include <utility>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

StreamEvent::StreamEvent(cudaStream_t stream) {
  check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t recorded = cudaEventRecord(event_, stream);
  if (recorded != cudaSuccess) cudaEventDestroy(std::exchange(event_, nullptr));
  check_cuda(recorded, "cudaEventRecord");
}

StreamEvent::~StreamEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

StreamEvent::StreamEvent(StreamEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

StreamEvent& StreamEvent::operator=(StreamEvent&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}

bool StreamEvent::passed() const {
  const cudaError_t state = cudaEventQuery(event_);
  if (state == cudaErrorNotReady) return false;
  check_cuda(state, "cudaEventQuery");
  return true;
}

void StreamEvent::wait() const { check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

}  // namespace loom::kernels::cuda
