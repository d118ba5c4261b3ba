// Releasable device memory on a real GPU (kernels/cuda/releasable_memory.h: CUDA's virtual memory
// management behind Allocator::decommit and commit): decommitted granules go back to the device
// (cudaMemGetInfo's free memory rises), the ends of a range keep their data, committed granules
// read zero and take writes; a decommit behind queued work returns without waiting for it, its
// chunks going once that work is done, and a commit meanwhile takes them back; and ZeRO-3 at dp 2
// (two thread ranks sharing the GPU) trains as ZeRO-1 does holding less committed device memory.
// Skipped, saying why, without a GPU; the
// emulated device's tests (tests/kernels/emulated_releasable_memory_test.cpp,
// tests/train/device_zero_memory_test.cpp) check the same contract everywhere.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <regex>
#include <string>
#include <vector>

#include "../train/training_runs.h"
#include "cuda_test_util.h"
#include "loom/core/device.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::kernels::cuda {
namespace {

class CudaReleasableMemory : public testing::GpuTest<> {};

size_t free_device_bytes() {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

std::vector<float> download(const float* d, int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  copy_to_host(Device::cuda(0), host.data(), d, n);
  return host;
}

TEST_F(CudaReleasableMemory, DecommittedGranulesGoBackToTheDeviceAndReturnZeroed) {
  const Device gpu = Device::cuda(0);
  Allocator& a = allocator(gpu);
  constexpr int64_t kMiB = int64_t{1} << 20, n = 64 * kMiB / 4;  // 64 MiB: 32 granules of 2 MiB
  const int64_t before = a.bytes_in_use();
  DeviceBuffer<float> d = DeviceBuffer<float>::releasable(gpu, n);
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  copy_from_host(gpu, d.data(), ones.data(), n);
  EXPECT_TRUE(a.holds(d.data() + n / 2));
  // From 1 MiB to 63 MiB: the 30 whole granules [2, 62) MiB are given back, the ends zeroed.
  const int64_t from = kMiB / 4, count = 62 * kMiB / 4;
  const size_t free_before = free_device_bytes();
  a.decommit(d.data() + from, static_cast<size_t>(count) * sizeof(float));
  a.synchronize();  // the chunks go once the work before the decommit is done, by this at the latest
  const size_t free_after = free_device_bytes();
  const int64_t released = before + n * 4 - a.bytes_in_use();
  std::printf("decommitted %lld bytes; cudaMemGetInfo's free memory rose by %lld bytes\n",
              static_cast<long long>(released), static_cast<long long>(free_after) - static_cast<long long>(free_before));
  EXPECT_EQ(released, 60 * kMiB);
  EXPECT_GE(static_cast<int64_t>(free_after) - static_cast<int64_t>(free_before), released - 2 * kMiB);
  EXPECT_TRUE(a.holds(d.data() + n / 2));  // the address range stays the buffer's
  // The ends, on granules shared with the data around the range: zero inside it, kept outside.
  const std::vector<float> head = download(d.data(), 2 * kMiB / 4), tail = download(d.data() + 62 * kMiB / 4, 2 * kMiB / 4);
  for (int64_t i = 0; i < 2 * kMiB / 4; i += 997) {
    EXPECT_EQ(head[static_cast<size_t>(i)], i < from ? 1.0f : 0.0f) << i;
    EXPECT_EQ(tail[static_cast<size_t>(i)], i < kMiB / 4 ? 0.0f : 1.0f) << i;
  }
  // Committed again: zero, writable, counted.
  a.commit(d.data(), d.bytes());
  EXPECT_EQ(a.bytes_in_use(), before + n * 4);
  const std::vector<float> back = download(d.data(), n);
  for (int64_t i = from; i < from + count; i += 4099) EXPECT_EQ(back[static_cast<size_t>(i)], 0.0f) << i;
  EXPECT_EQ(back.front(), 1.0f);
  EXPECT_EQ(back.back(), 1.0f);
  const std::vector<float> twos(static_cast<size_t>(count), 2.0f);
  copy_from_host(gpu, d.data() + from, twos.data(), count);
  EXPECT_EQ(download(d.data() + n / 2, 1)[0], 2.0f);
  d.release();
  EXPECT_EQ(a.bytes_in_use(), before);
}

// Holds the calling thread's compute stream until `open` (a host function queued on it; it gives
// up after a minute, so that a test gone wrong fails instead of hanging).
void hold_stream(std::atomic<bool>& open) {
  check_cuda(cudaLaunchHostFunc(
                 compute_stream(0),
                 [](void* flag) {
                   const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
                   while (!static_cast<std::atomic<bool>*>(flag)->load() && std::chrono::steady_clock::now() < give_up)
                     std::this_thread::sleep_for(std::chrono::microseconds(50));
                 },
                 &open),
             "cudaLaunchHostFunc");
}

size_t free_device_bytes_now() {  // without waiting for the device
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

// A decommit behind queued work neither waits for it nor frees the granules under it: the stream
// is held by a host function, and the decommit returns at once, the device's free memory unchanged.
// A commit meanwhile takes its granules back (no new chunks; zeroed after that work, in stream
// order). Once the work is done, synchronize() has the others' chunks back with the device.
TEST_F(CudaReleasableMemory, ADecommitWaitsForNoWorkAndItsChunksGoOnceTheWorkBeforeItIsDone) {
  const Device gpu = Device::cuda(0);
  Allocator& a = allocator(gpu);
  constexpr int64_t kMiB = int64_t{1} << 20, n = 64 * kMiB / 4;  // 32 granules of 2 MiB
  const int64_t before = a.bytes_in_use();
  DeviceBuffer<float> d = DeviceBuffer<float>::releasable(gpu, n);
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  copy_from_host(gpu, d.data(), ones.data(), n);
  a.synchronize();
  const size_t free_at_start = free_device_bytes_now();

  // Opened by the test, or by this after 5 s in case a decommit does wait (then the checks below
  // fail instead of hanging); opened and joined however the test ends, so the host function never
  // outlives the flag.
  struct Gate {
    std::atomic<bool> open{false}, done{false};
    std::thread opener{[this] {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!done && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      open = true;
    }};
    ~Gate() {
      done = true;
      opener.join();
      (void)cudaStreamSynchronize(compute_stream(0));
    }
  } gate;
  std::atomic<bool>& open = gate.open;
  hold_stream(open);
  const auto t0 = std::chrono::steady_clock::now();
  a.decommit(d.data(), static_cast<size_t>(n / 2) * sizeof(float));  // granules [0, 16)
  const double decommit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(decommit_s, 1.0) << "the decommit waited for the held stream";
  EXPECT_FALSE(open.load()) << "the decommit waited for the held stream";
  EXPECT_EQ(a.bytes_in_use(), before + n * 2);  // counted as given back at once
  EXPECT_LE(free_device_bytes_now(), free_at_start + static_cast<size_t>(2 * kMiB)) << "chunks freed under queued work";
  a.commit(d.data(), static_cast<size_t>(n / 8) * sizeof(float));  // granules [0, 4) taken back
  EXPECT_EQ(a.bytes_in_use(), before + n * 2 + n / 2);
  // Taken back, not made anew (4 new chunks would take 8 MiB of the device's free memory).
  EXPECT_GE(free_device_bytes_now() + static_cast<size_t>(2 * kMiB), free_at_start);
  EXPECT_FALSE(open.load()) << "the commit waited for the held stream";
  gate.done = true;
  a.synchronize();
  const int64_t rose = static_cast<int64_t>(free_device_bytes_now()) - static_cast<int64_t>(free_at_start);
  std::printf("after the held work: the device's free memory rose by %lld bytes (12 granules: %lld)\n",
              static_cast<long long>(rose), static_cast<long long>(24 * kMiB));
  EXPECT_GE(rose, 22 * kMiB);
  EXPECT_LE(rose, 26 * kMiB);
  const std::vector<float> back = download(d.data(), n / 8);
  for (int64_t i = 0; i < n / 8; i += 4099) EXPECT_EQ(back[static_cast<size_t>(i)], 0.0f) << i;
  EXPECT_EQ(download(d.data() + n / 2, 1)[0], 1.0f);
  a.commit(d.data(), d.bytes());
  EXPECT_EQ(a.bytes_in_use(), before + n * 4);
  d.release();
  EXPECT_EQ(a.bytes_in_use(), before);
}

struct Committed {
  int64_t peak = 0, after = 0;
};

Committed committed_in_step_1(const std::string& console) {
  std::smatch m;
  Committed c;
  if (std::regex_search(console, m, std::regex(R"(cuda:0 committed: (\d+) bytes \([^)]*\) at the peak of step 1, (\d+) bytes after it)"))) {
    c.peak = std::stoll(m[1]);
    c.after = std::stoll(m[2]);
  }
  return c;
}

// 8 layers of d_model 512 (about 3.1M parameters each, several granules per unit): per rank,
// ZeRO-1 holds the full values and gradients, half the moments and its buckets' staging (about
// 3.5 model sizes and more); ZeRO-3 its shards (2) and at most five units' values and gradients
// in flight (5/8): so below 0.8 of ZeRO-1's committed bytes at the peak of a step. Both ranks
// share the GPU's allocator, so its count covers both.
TEST_F(CudaReleasableMemory, Zero3AtDp2HoldsLessDeviceMemoryThanZero1) {
  set_cuda_starter(&start_backend);
  const std::string root = train::testing::make_training_root("cuda-zero-memory");
  const std::string yaml =
      "model: {vocab_size: 0, d_model: 512, layers: 8, heads: 8, kv_heads: 4, ffn_size: 1536, max_seq_len: 32,\n"
      "        norm: rms, activation: swiglu, positions: rope, tied_embeddings: true}\n" +
      train::testing::data_section(root) +
      "optim: {lr: 1.0e-3, warmup_steps: 2, clip_grad: 0.5, weight_decay: 0.1}\n"
      "train: {steps: 2, global_batch: 8, micro_batch: 2, threads: 1, seed: 7}\n"
      "log: {progress: false, interval: 100}\n";
  std::vector<double> losses[2];
  Committed committed[2];
  for (int i = 0; i < 2; ++i) {
    const std::string stage = i == 0 ? "1" : "3";
    std::string console;
    losses[i] = train::testing::losses_of(train::testing::train_run(
        root, "zero" + stage, yaml, {"runtime.ranks=2", "runtime.device=cuda", "parallel.zero=" + stage}, &console));
    committed[i] = committed_in_step_1(console);
    ASSERT_GT(committed[i].peak, 0) << console;
    std::printf("zero %s: committed device bytes %lld at the peak of step 1, %lld after it\n", stage.c_str(),
                static_cast<long long>(committed[i].peak), static_cast<long long>(committed[i].after));
  }
  ASSERT_EQ(losses[0].size(), 2u);
  ASSERT_EQ(losses[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(losses[1][s], losses[0][s], 1e-4 * std::fabs(losses[0][s])) << s;
  EXPECT_LT(static_cast<double>(committed[1].peak), 0.8 * static_cast<double>(committed[0].peak));
  EXPECT_LT(committed[1].after, committed[0].after);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace loom::kernels::cuda
