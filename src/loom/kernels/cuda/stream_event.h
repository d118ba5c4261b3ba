#pragma once
// A point in a stream's work: an event recorded on the stream when made, destroyed with its
// holder. What follows it waits for it on the device (another stream: cudaStreamWaitEvent on
// event()) or on the host (wait()); passed() asks without waiting. The NCCL backend's completion
// events and releasable memory's release fences are these.
#include <cuda_runtime.h>

namespace loom::kernels::cuda {

class StreamEvent {
 public:
  explicit StreamEvent(cudaStream_t stream);  // recorded on `stream` now
  ~StreamEvent();
  StreamEvent(StreamEvent&& other) noexcept;
  StreamEvent& operator=(StreamEvent&& other) noexcept;
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  bool passed() const;  // the stream's work before it is done; an Error if that work failed
  void wait() const;    // blocks the host until then
  cudaEvent_t event() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace loom::kernels::cuda
