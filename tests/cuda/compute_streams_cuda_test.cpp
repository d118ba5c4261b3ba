// The compute streams on a real GPU (kernels/cuda/compute_streams.h): a stream per compute queue
// of the calling thread, blocking with respect to the legacy default stream; device memory freed
// on one stream is handed out again only on that stream, by the device's allocator and by the
// entries' scratch; ranks of a threads world sharing the GPU, each on its own stream, get exactly
// the results one thread gets; transfers not waited for land in their stream's order. Skipped,
// saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "cuda_test_util.h"
#include "loom/comm/launch.h"
#include "loom/core/compute_queue.h"
#include "loom/core/device.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

class CudaComputeStreams : public testing::GpuTest<> {};

cudaStream_t stream_of_queue(int queue) {
  ComputeQueueScope scope(queue);
  return compute_stream(0);
}

TEST_F(CudaComputeStreams, EachQueueHasABlockingStreamOfItsOwn) {
  {
    ComputeQueueScope queue(12);
    const cudaStream_t made = compute_stream(0);
    EXPECT_EQ(made_compute_stream(0), made);
  }
  const cudaStream_t process = stream_of_queue(0), first = stream_of_queue(1), second = stream_of_queue(2);
  EXPECT_NE(process, nullptr);  // not the legacy default stream
  EXPECT_NE(process, first);
  EXPECT_NE(first, second);
  EXPECT_EQ(stream_of_queue(1), first);                     // made once
  EXPECT_EQ(stream_of_queue(kComputeStreams), first);       // queues beyond the streams share in turn
  for (cudaStream_t s : {process, first, second}) {
    unsigned flags = 99;
    check_cuda(cudaStreamGetFlags(s, &flags), "cudaStreamGetFlags");
    EXPECT_EQ(flags, static_cast<unsigned>(cudaStreamDefault));  // ordered with the legacy stream
  }
}

// Queues no other test uses and sizes no other test asks for, so no block of theirs is cached.
constexpr int kFirst = 13, kSecond = 14;

// What a stream frees may still be in use by work queued there: only that stream gets it again.
TEST_F(CudaComputeStreams, MemoryFreedOnAStreamIsHandedOutAgainOnlyThere) {
  Allocator& device = allocator(Device::cuda(0));
  constexpr size_t kBytes = (size_t{37} << 20) + 12345;
  void* freed = nullptr;
  {
    ComputeQueueScope first(kFirst);
    freed = device.allocate(kBytes);
    device.zero(freed, kBytes);  // queued on that queue's stream
    device.free(freed, kBytes);
  }
  void* other = nullptr;
  {
    ComputeQueueScope second(kSecond);
    other = device.allocate(kBytes);
  }
  EXPECT_NE(other, freed);
  {
    ComputeQueueScope first(kFirst);
    void* again = device.allocate(kBytes);
    EXPECT_EQ(again, freed);  // reused in stream order
    device.free(again, kBytes);
  }
  ComputeQueueScope second(kSecond);
  device.free(other, kBytes);
  device.synchronize();
}

TEST_F(CudaComputeStreams, ScratchIsTheStreamsOwn) {
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  void* first_bytes = nullptr;
  {
    ComputeQueueScope first(kFirst);
    Scratch scratch;
    first_bytes = scratch.bytes(777777);
  }
  {
    ComputeQueueScope second(kSecond);
    Scratch scratch;
    EXPECT_NE(scratch.bytes(777777), first_bytes);
  }
  ComputeQueueScope first(kFirst);
  Scratch scratch;
  EXPECT_EQ(scratch.bytes(777777), first_bytes);
}

// Four ranks on the one GPU, each queueing allocations, copies, sums and frees on its own stream
// without waiting in between: every rank's sums are exact, as one thread's would be.
TEST_F(CudaComputeStreams, RanksSharingTheGpuGetExactlyTheirOwnResults) {
  const Device gpu = Device::cuda(0);
  constexpr int kRanks = 4, kRounds = 50;
  constexpr int64_t n = 1 << 18;
  std::vector<int> mismatches(kRanks, -1);
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = kRanks;
  comm::launch(options, [&](comm::Communicator& world) {
    const int rank = world.rank();
    std::vector<float> ones(static_cast<size_t>(n), 1.0f);
    DeviceBuffer<float> total(gpu, n);  // zero
    DeviceBuffer<float> one(gpu, n);
    copy_from_host(gpu, one.data(), ones.data(), n);
    for (int round = 0; round < kRounds; ++round) {
      DeviceBuffer<float> step(gpu, n);  // freed at the round's end while its work may be queued
      for (int k = 0; k <= rank; ++k) add_in_place(gpu, step.data(), one.data(), n);
      add_in_place(gpu, total.data(), step.data(), n);
    }
    std::vector<float> host(static_cast<size_t>(n));
    copy_to_host(gpu, host.data(), total.data(), n);
    const float expected = static_cast<float>(kRounds * (rank + 1));
    mismatches[static_cast<size_t>(rank)] =
        static_cast<int>(std::count_if(host.begin(), host.end(), [&](float x) { return x != expected; }));
  });
  EXPECT_EQ(mismatches, std::vector<int>(kRanks, 0));
}

// Transfers not waited for (Allocator::to_host_async / from_host_async) through pinned staging, in
// the compute stream's order: 64 MiB made on the device by 20 queued adds come down behind them
// once the fence is waited for, and go back up ahead of the next add, in chunks as the offloaded
// optimizer moves them, the next chunk queued before the host reads the previous one.
TEST_F(CudaComputeStreams, TransfersNotWaitedForLandInTheStreamsOrder) {
  const Device gpu = Device::cuda(0);
  constexpr int64_t n = int64_t{16} << 20, chunks = 4, chunk = n / chunks;
  Allocator& device = allocator(gpu);
  auto* staging = static_cast<float*>(device.allocate_transfer_staging(2 * chunk * sizeof(float)));
  std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  DeviceBuffer<float> x(gpu, n), one(gpu, n);
  copy_from_host(gpu, one.data(), ones.data(), n);
  for (int k = 0; k < 20; ++k) add_in_place(gpu, x.data(), one.data(), n);
  std::vector<std::unique_ptr<DeviceFence>> down(chunks);
  auto send_down = [&](int64_t c) {
    device.to_host_async(staging + (c % 2) * chunk, x.data() + c * chunk, chunk * sizeof(float));
    down[static_cast<size_t>(c)] = device.fence();
  };
  int64_t wrong = 0;
  send_down(0);
  for (int64_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) send_down(c + 1);
    down[static_cast<size_t>(c)]->wait();
    float* slot = staging + (c % 2) * chunk;
    wrong += std::count_if(slot, slot + chunk, [](float v) { return v != 20.0f; });
    for (int64_t i = 0; i < chunk; ++i) slot[i] += static_cast<float>(c);
    device.from_host_async(x.data() + c * chunk, slot, chunk * sizeof(float));
  }
  add_in_place(gpu, x.data(), one.data(), n);
  device.fence()->wait();
  EXPECT_EQ(wrong, 0);
  std::vector<float> host(static_cast<size_t>(n));
  copy_to_host(gpu, host.data(), x.data(), n);
  for (int64_t c = 0; c < chunks; ++c) {
    const float expected = 21.0f + static_cast<float>(c);
    EXPECT_EQ(std::count_if(host.begin() + c * chunk, host.begin() + (c + 1) * chunk,
                            [&](float v) { return v != expected; }),
              0)
        << "chunk " << c;
  }
  device.free_transfer_staging(staging, 2 * chunk * sizeof(float));
}

}  // namespace
}  // namespace loom::kernels::cuda
