#include "loom/kernels/cuda/compute_streams.h"

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "loom/core/compute_queue.h"
#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

namespace {

using Streams = std::array<std::array<std::atomic<cudaStream_t>, kComputeStreams>, kMaxCudaDevices>;

Streams& streams() {
  static auto* made = new Streams();  // never destroyed: at exit the runtime may be gone first
  return *made;
}

cudaStream_t make_stream(int device) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check_cuda(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamDefault),
             "cudaStreamCreateWithFlags (compute stream of cuda:" + std::to_string(device) + ")");
  if (current != device) check_cuda(cudaSetDevice(current), "cudaSetDevice(" + std::to_string(current) + ")");
  return stream;
}

std::atomic<cudaStream_t>& stream_slot(int device) {
  LOOM_CHECK(device >= 0 && device < kMaxCudaDevices,
             "compute stream: device " + std::to_string(device) + " beyond the supported " +
                 std::to_string(kMaxCudaDevices));
  return streams()[static_cast<size_t>(device)][static_cast<size_t>(compute_stream_slot())];
}

}  // namespace

int compute_stream_slot() {
  const int queue = compute_queue();
  return queue == 0 ? 0 : 1 + (queue - 1) % (kComputeStreams - 1);
}

cudaStream_t made_compute_stream(int device) { return stream_slot(device).load(std::memory_order_acquire); }

void synchronize_compute_streams(int device) {
  LOOM_CHECK(device >= 0 && device < kMaxCudaDevices,
             "compute streams: device " + std::to_string(device) + " beyond the supported " +
                 std::to_string(kMaxCudaDevices));
  for (std::atomic<cudaStream_t>& slot : streams()[static_cast<size_t>(device)]) {
    if (cudaStream_t stream = slot.load(std::memory_order_acquire))
      check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (compute stream of cuda:" +
                                                    std::to_string(device) + ")");
  }
}

cudaStream_t compute_stream(int device) {
  std::atomic<cudaStream_t>& slot = stream_slot(device);
  if (cudaStream_t stream = slot.load(std::memory_order_acquire)) return stream;
  static std::mutex making;
  std::lock_guard<std::mutex> lock(making);
  if (cudaStream_t stream = slot.load(std::memory_order_acquire)) return stream;
  const cudaStream_t stream = make_stream(device);
  slot.store(stream, std::memory_order_release);
  return stream;
}

}  // namespace loom::kernels::cuda
