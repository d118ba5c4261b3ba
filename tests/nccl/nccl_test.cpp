// The nccl backend of Communicator against a serial reference: one rank per visible GPU (ranks of
// this process, ncclCommInitAll; a thread each), every collective on awkward sizes (0, 1, a prime,
// a large count that is no multiple of anything), the reductions Sum, Avg and Max, split, and
// send/recv around a ring where there are two ranks or more, and exchange_async's batch around a
// ring at any size (to itself at one). NCCL refuses two ranks on one GPU,
// so a one-GPU machine runs this at world size 1. Then the waits: wait_in_stream leaves the host
// free while the compute stream waits for the result; a host wait past its timeout throws and
// aborts the group; a stream-ordered one past its timeout ends the process, naming the operation.
// Skipped, saying why, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "../cuda/cuda_test_util.h"
#include "loom/comm/nccl/communicator.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"

namespace loom::comm {
namespace {

using kernels::cuda::check_cuda;
using kernels::cuda::testing::random_values;

// A device buffer of one rank's GPU.
struct Buffer {
  float* ptr = nullptr;
  size_t n = 0;
  Buffer(const std::vector<float>& host) : n(host.size()) {
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(1, n) * sizeof(float)), "cudaMalloc");
    if (n) check_cuda(cudaMemcpy(ptr, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Buffer() { cudaFree(ptr); }
  std::vector<float> host() const {
    std::vector<float> out(n);
    if (n) check_cuda(cudaMemcpy(out.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
};

class NcclCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    const int gpus = kernels::cuda::device_status().devices;
    devices_.resize(static_cast<size_t>(gpus));
    std::iota(devices_.begin(), devices_.end(), 0);
    comms_ = make_nccl_communicators(devices_, "world", CommOptions{std::chrono::seconds(60)});
    seed_ = kernels::cuda::testing::fresh_seed();
  }
  int size() const { return static_cast<int>(comms_.size()); }
  // Runs body(rank) on every rank at once (a thread each), on that rank's GPU.
  void on_every_rank(const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    std::vector<std::exception_ptr> errors(comms_.size());
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        try {
          check_cuda(cudaSetDevice(devices_[size_t(r)]), "cudaSetDevice");
          body(r);
        } catch (...) {
          errors[size_t(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }
  std::vector<float> input(int rank, int64_t n) const { return random_values(seed_ + 7919 * rank + uint32_t(n), n, 1.0f); }

  std::vector<int> devices_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  uint32_t seed_ = 0;
};

constexpr int64_t kSizes[] = {0, 1, 7, 1021, (1 << 20) + 3};

// Where a result is off: the first element that differs and how many are not finite; then the
// same after a device-wide synchronize (if that changes them, the collective's wait was short).
std::string describe(const Buffer& got, const std::vector<float>& want) {
  auto summary = [&](const std::vector<float>& values) {
    int64_t first = -1, not_finite = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) ++not_finite;
      if (first < 0 && std::fabs(values[i] - want[i]) > 1e-5f * (1.0f + std::fabs(want[i]))) first = int64_t(i);
    }
    std::string s = std::to_string(not_finite) + " not finite";
    if (first >= 0)
      s += ", first off at " + std::to_string(first) + ": " + std::to_string(values[size_t(first)]) + " for " +
           std::to_string(want[size_t(first)]);
    return s;
  };
  std::string text = "right after wait: " + summary(got.host());
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return text + "; after a synchronize: " + summary(got.host());
}

TEST_F(NcclCollectives, ReductionsMatchTheSerialReference) {
  for (int64_t n : kSizes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      std::vector<float> want(static_cast<size_t>(n), op == ReduceOp::Max ? -INFINITY : 0.0f);
      for (int r = 0; r < size(); ++r) {
        const std::vector<float> x = input(r, n);
        for (int64_t i = 0; i < n; ++i) want[i] = op == ReduceOp::Max ? std::max(want[i], x[i]) : want[i] + x[i];
      }
      if (op == ReduceOp::Avg)
        for (float& w : want) w /= static_cast<float>(size());
      on_every_rank([&](int r) {
        Buffer data(input(r, n));
        comms_[size_t(r)]->all_reduce(data.ptr, n, DType::F32, op);
        EXPECT_LE(kernels::cuda::testing::relative_error(data.host(), want), 1e-6)
            << "all_reduce " << reduce_op_name(op) << " " << n << ": " << describe(data, want);
        // reduce_scatter: rank r keeps block r of the sum of every rank's size() blocks.
        std::vector<float> blocks;
        for (int b = 0; b < size(); ++b) {
          const std::vector<float> x = input(r, n);
          blocks.insert(blocks.end(), x.begin(), x.end());
        }
        Buffer send(blocks), recv(std::vector<float>(static_cast<size_t>(n), NAN));
        comms_[size_t(r)]->reduce_scatter(send.ptr, recv.ptr, n, DType::F32, op);
        EXPECT_LE(kernels::cuda::testing::relative_error(recv.host(), want), 1e-6)
            << "reduce_scatter " << reduce_op_name(op) << " " << n << ": " << describe(recv, want);
        Buffer reduced(std::vector<float>(static_cast<size_t>(n), NAN)), mine(input(r, n));
        comms_[size_t(r)]->reduce(mine.ptr, reduced.ptr, n, DType::F32, op, 0);
        if (r == 0) {
          EXPECT_LE(kernels::cuda::testing::relative_error(reduced.host(), want), 1e-6)
              << "reduce " << reduce_op_name(op) << " " << n << ": " << describe(reduced, want);
        }
      });
    }
  }
}

TEST_F(NcclCollectives, DataMovementMatchesTheSerialReference) {
  for (int64_t n : kSizes) {
    std::vector<float> gathered, gathered_v;
    std::vector<int64_t> counts;
    for (int r = 0; r < size(); ++r) {
      const std::vector<float> x = input(r, n);
      gathered.insert(gathered.end(), x.begin(), x.end());
      counts.push_back(n + r);
      const std::vector<float> y = input(r, n + r);
      gathered_v.insert(gathered_v.end(), y.begin(), y.end());
    }
    on_every_rank([&](int r) {
      Communicator& c = *comms_[size_t(r)];
      Buffer mine(input(r, n)), all(std::vector<float>(gathered.size(), NAN));
      c.all_gather(mine.ptr, all.ptr, n, DType::F32);
      EXPECT_EQ(all.host(), gathered) << "all_gather " << n;
      Buffer mine_v(input(r, n + r)), all_v(std::vector<float>(gathered_v.size(), NAN));
      c.all_gather_v(mine_v.ptr, all_v.ptr, counts, DType::F32);
      EXPECT_EQ(all_v.host(), gathered_v) << "all_gather_v " << n;
      Buffer b(input(r, n));
      c.broadcast(b.ptr, n, DType::F32, size() - 1);
      EXPECT_EQ(b.host(), input(size() - 1, n)) << "broadcast " << n;
      // all_to_all: block j of rank i's send goes to rank j; here every rank sends its gathered copy.
      Buffer send(gathered), recv(std::vector<float>(gathered.size(), NAN));
      c.all_to_all(send.ptr, recv.ptr, n, DType::F32);
      std::vector<float> want;
      for (int i = 0; i < size(); ++i) want.insert(want.end(), gathered.begin() + r * n, gathered.begin() + (r + 1) * n);
      EXPECT_EQ(recv.host(), want) << "all_to_all " << n;
      c.barrier();
    });
  }
}

TEST_F(NcclCollectives, SplitAndSendRecvAroundARing) {
  on_every_rank([&](int r) {
    auto half = comms_[size_t(r)]->split(r % 2, -r, "half");
    ASSERT_NE(half, nullptr);
    EXPECT_EQ(half->size(), (size() + 1 - r % 2) / 2);
    Buffer one(std::vector<float>{1.0f});
    half->all_reduce(one.ptr, 1, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(one.host()[0], static_cast<float>(half->size()));
    EXPECT_EQ(comms_[size_t(r)]->split(-1, 0, "none"), nullptr);
  });
  if (size() < 2) GTEST_SKIP() << "send/recv needs two ranks on two GPUs (NCCL refuses two ranks on one GPU); this machine has "
                               << size();
  const int64_t n = 1021;
  on_every_rank([&](int r) {
    Communicator& c = *comms_[size_t(r)];
    Buffer out(input(r, n)), in(std::vector<float>(n, NAN));
    // Even ranks send first, odd ranks receive first: NCCL runs one operation at a time per
    // communicator, so two ranks sending to each other at once would wait for each other.
    if (r % 2 == 0) {
      c.send(out.ptr, n, DType::F32, (r + 1) % size(), 0);
      c.recv(in.ptr, n, DType::F32, (r + size() - 1) % size(), 0);
    } else {
      c.recv(in.ptr, n, DType::F32, (r + size() - 1) % size(), 0);
      c.send(out.ptr, n, DType::F32, (r + 1) % size(), 0);
    }
    EXPECT_EQ(in.host(), input((r + size() - 1) % size(), n));
  });
}

// exchange_async (one NCCL group): every rank sends to the next and receives from the previous,
// the sends listed first, which only a group survives; two messages per pair (a second one of
// another size, matched in issue order). At world size 1 both peers are the rank itself (NCCL
// allows a send to self with its recv in the same group).
TEST_F(NcclCollectives, ExchangeAroundARingSendsFirstAndToItself) {
  for (int64_t n : kSizes) {
    on_every_rank([&](int r) {
      Communicator& c = *comms_[size_t(r)];
      const int next = (r + 1) % size(), previous = (r + size() - 1) % size();
      Buffer out(input(r, n)), more(input(r, n + 3)), in(std::vector<float>(size_t(n), NAN)),
          in_more(std::vector<float>(size_t(n + 3), NAN));
      const PeerOp ops[] = {PeerOp::send(out.ptr, n, DType::F32, next, 0), PeerOp::send(more.ptr, n + 3, DType::F32, next, 1),
                            PeerOp::recv(in.ptr, n, DType::F32, previous, 0),
                            PeerOp::recv(in_more.ptr, n + 3, DType::F32, previous, 1)};
      all_of(c.exchange_async(ops))->wait();
      EXPECT_EQ(in.host(), input(previous, n)) << "exchange " << n;
      EXPECT_EQ(in_more.host(), input(previous, n + 3)) << "exchange " << n + 3;
    });
  }
}

// Holds the calling thread's compute stream on `device` until open() (a host function queued on
// it): what the stream has queued after it, and every operation issued meanwhile (its
// communication stream waits for the compute stream), cannot start. While it is closed, nothing
// that synchronizes the device (cudaMallocHost, cudaFree) may run on the thread that opens it. It
// gives up after a minute, so that a test gone wrong fails instead of hanging.
class StreamGate {
 public:
  explicit StreamGate(int device) : stream_(kernels::cuda::compute_stream(device)) {
    check_cuda(cudaLaunchHostFunc(stream_, &StreamGate::hold, &open_), "cudaLaunchHostFunc");
  }
  ~StreamGate() {
    open();
    (void)cudaStreamSynchronize(stream_);  // the host function reads the flag until it is done
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() { open_ = true; }

 private:
  static void hold(void* flag) {
    auto* open = static_cast<std::atomic<bool>*>(flag);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (!open->load() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  cudaStream_t stream_;
  std::atomic<bool> open_{false};
};

// The compute stream's later work reads the result of an operation it waited for (wait_in_stream)
// while the host went on: the reduce_scatter is held behind a gate on the compute stream, so it
// cannot have run when wait_in_stream returns (test() says not done), and the copy of the result's
// last element queued right after would read the poison without the stream's wait (a 1 GiB
// copy or reduction writes that element last, the 4-byte read takes microseconds).
TEST_F(NcclCollectives, WaitInStreamLeavesTheHostFreeAndOrdersTheComputeStreamAfterTheResult) {
  const int64_t n = (int64_t(1) << 28) + 5;  // per rank: 1 GiB of fp32
  on_every_rank([&](int r) {
    Communicator& c = *comms_[size_t(r)];
    const int device = devices_[size_t(r)];
    float* send = nullptr;
    float* recv = nullptr;
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&send), size_t(n) * size() * sizeof(float)), "cudaMalloc");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&recv), size_t(n) * sizeof(float)), "cudaMalloc");
    const std::unique_ptr<float, decltype(&cudaFree)> free_send(send, &cudaFree), free_recv(recv, &cudaFree);
    const float last = 1.0f + static_cast<float>(r);
    // Every element of every rank's blocks is 1 but its blocks' last ones: rank r's are 1 + r.
    const std::vector<float> ones(1 << 20, 1.0f);
    for (int64_t at = 0; at < n * size(); at += int64_t(ones.size())) {
      const int64_t count = std::min<int64_t>(int64_t(ones.size()), n * size() - at);
      check_cuda(cudaMemcpy(send + at, ones.data(), sizeof(float) * size_t(count), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
    }
    for (int b = 0; b < size(); ++b)
      check_cuda(cudaMemcpy(send + (b + 1) * n - 1, &last, sizeof last, cudaMemcpyHostToDevice), "cudaMemcpy");
    const float nan = NAN;
    check_cuda(cudaMemcpy(recv + n - 1, &nan, sizeof nan, cudaMemcpyHostToDevice), "cudaMemcpy");

    float* seen = nullptr;  // allocated before the gate closes: cudaMallocHost may wait for the device
    check_cuda(cudaMallocHost(reinterpret_cast<void**>(&seen), sizeof(float)), "cudaMallocHost");
    const std::unique_ptr<float, decltype(&cudaFreeHost)> free_seen(seen, &cudaFreeHost);
    *seen = -1.0f;

    StreamGate gate(device);
    WorkHandle work = c.reduce_scatter_async(send, recv, n, DType::F32, ReduceOp::Sum);
    work->wait_in_stream();
    EXPECT_FALSE(work->test()) << "the reduce_scatter completed behind a closed gate";
    const cudaStream_t stream = kernels::cuda::compute_stream(device);
    check_cuda(cudaMemcpyAsync(seen, recv + n - 1, sizeof(float), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    gate.open();
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    // The sum over ranks of 1 + rank.
    EXPECT_EQ(*seen, static_cast<float>(size() * (size() + 1) / 2)) << "rank " << r;
    work->wait();
    EXPECT_TRUE(work->test());
  });
}

// A host wait past the group's timeout: an Error naming the operation and the timeout, the
// communicator aborted, and every later operation of the group an Error that says why. The gate
// opens from another thread a second in: the abort may wait for the device, so for the gate.
TEST_F(NcclCollectives, AWaitPastItsTimeoutThrowsAndAbortsTheGroup) {
  if (size() != 1) GTEST_SKIP() << "one rank's operation held back; with " << size() << " ranks the others would wait";
  auto comms = make_nccl_communicators(devices_, "held", CommOptions{std::chrono::milliseconds(300)});
  Communicator& c = *comms[0];
  Buffer data(std::vector<float>(1021, 1.0f));
  StreamGate gate(devices_[0]);
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    gate.open();
  });
  WorkHandle work = c.all_reduce_async(data.ptr, 1021, DType::F32, ReduceOp::Sum);
  try {
    work->wait();
    ADD_FAILURE() << "the wait returned behind a closed gate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl group 'held' (rank 0 of 1): all_reduce #1 timed out after 300 ms"),
              std::string::npos)
        << e.what();
  }
  opener.join();
  check_cuda(cudaStreamSynchronize(kernels::cuda::compute_stream(devices_[0])), "cudaStreamSynchronize");
  try {
    c.all_reduce(data.ptr, 1021, DType::F32, ReduceOp::Sum);
    ADD_FAILURE() << "an operation after the abort was issued";
  } catch (const Error& e) {
    const std::string want = "after the NCCL communicator was aborted (nccl group 'held'";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// A stream-ordered wait past the timeout: the host never blocks on it, so the watchdog reports it
// and ends the process (its compute stream may have read the incomplete result).
TEST_F(NcclCollectives, AStreamOrderedWaitPastItsTimeoutEndsTheProcessNamingTheOperation) {
  if (size() != 1) GTEST_SKIP() << "one rank's operation held back; with " << size() << " ranks the others would wait";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: CUDA does not survive fork
  const int device = devices_[0];
  EXPECT_EXIT(
      {
        const std::vector<int> one{device};
        auto comms = make_nccl_communicators(one, "held", CommOptions{std::chrono::milliseconds(300)});
        Buffer data(std::vector<float>(7, 1.0f));
        StreamGate gate(device);
        comms[0]->all_reduce(data.ptr, 7, DType::F32, ReduceOp::Sum);  // returns: the compute stream waits
        std::this_thread::sleep_for(std::chrono::seconds(30));
        std::fprintf(stderr, "the watchdog did not end the process\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(1), "nccl group 'held' \\(rank 0 of 1\\): all_reduce #1 timed out after 300 ms");
}

}  // namespace
}  // namespace loom::comm
