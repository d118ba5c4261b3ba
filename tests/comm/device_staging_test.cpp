// stage_device_buffers (comm/device_staging.h) over the threads backend, with every buffer in
// the emulated CUDA device's memory (tests/support/emulated_cuda.h: the host cannot dereference
// it, so a collective that read or wrote a device buffer directly would crash): every collective
// and send/recv on 3 ranks (two ranks share cuda:0, as ranks share one GPU in the GPU tests)
// against the serial reference, at 0, 1 and 1009 elements; host buffers beside device ones;
// operations waited for out of order; groups from split() staging too. Values are small
// integers, so sums are exact and every result is compared bit for bit.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

#include "loom/comm/device_staging.h"
#include "loom/comm/launch.h"
#include "loom/core/device.h"
#include "serial_reference.h"
#include "support/emulated_cuda.h"
#include "support/emulated_device_comm.h"

namespace loom::comm {
namespace {

constexpr int kRanks = 3;
const std::vector<int64_t> kCounts = {0, 1, 1009};

Device device_of(int rank) { return Device::cuda(rank % 2); }

// Rank r's input of n elements: small integers, different on every rank.
std::vector<float> input(int rank, int64_t n, int salt = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>((i * 7 + rank * 13 + salt * 5) % 17 - 8);
  return v;
}

std::vector<double> widened(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// A device copy of host values, and back.
class OnDevice {
 public:
  OnDevice(Device device, const std::vector<float>& values) : OnDevice(device, static_cast<int64_t>(values.size())) {
    copy_from_host(device_, data_, values.data(), size_);
  }
  OnDevice(Device device, int64_t n) : device_(device), size_(n) {
    data_ = static_cast<float*>(allocator(device).allocate(static_cast<size_t>(n) * sizeof(float)));
    if (n > 0) {
      const std::vector<float> poison(static_cast<size_t>(n), -1e30f);
      copy_from_host(device_, data_, poison.data(), n);
    }
  }
  ~OnDevice() { allocator(device_).free(data_, static_cast<size_t>(size_) * sizeof(float)); }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  float* data() { return data_; }
  std::vector<double> values() const {
    std::vector<float> host(static_cast<size_t>(size_));
    copy_to_host(device_, host.data(), data_, size_);
    return widened(host);
  }

 private:
  Device device_;
  int64_t size_;
  float* data_ = nullptr;
};

void run(const std::function<void(Communicator& world, Device device)>& body) {
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = kRanks;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    const Device device = device_of(world.rank());
    std::unique_ptr<Communicator> staged = stage_device_buffers(world, device);
    body(*staged, device);
  });
}

reference::Buffers inputs(int64_t n, int salt = 0) {
  reference::Buffers in;
  for (int r = 0; r < kRanks; ++r) in.push_back(widened(input(r, n, salt)));
  return in;
}

class DeviceStaging : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ::loom::testing::install_emulated_cuda(); }
};

TEST_F(DeviceStaging, TheAllocatorSaysWhichPointersAreItsMemory) {
  OnDevice buffer(Device::cuda(0), 10);
  std::vector<float> host(10);
  EXPECT_TRUE(allocator(Device::cuda(0)).holds(buffer.data()));
  EXPECT_TRUE(allocator(Device::cuda(0)).holds(buffer.data() + 9));
  EXPECT_FALSE(allocator(Device::cuda(0)).holds(host.data()));
  EXPECT_FALSE(host_allocator().holds(host.data()));
  // Host memory needs no staging: asked for the CPU, it refuses.
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = 1;
  launch(options, [](Communicator& world) { EXPECT_THROW(stage_device_buffers(world, Device::cpu()), Error); });
}

TEST_F(DeviceStaging, ReductionsOnDeviceBuffersEqualTheSerialReference) {
  run([](Communicator& c, Device device) {
    const int r = c.rank();
    for (int64_t n : kCounts) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        OnDevice data(device, input(r, n));
        c.all_reduce(data.data(), n, DType::F32, op);
        EXPECT_EQ(data.values(), reference::reduce(inputs(n), op)) << "all_reduce n " << n;

        OnDevice send(device, input(r, n * kRanks)), recv(device, n);
        c.reduce_scatter(send.data(), recv.data(), n, DType::F32, op);
        EXPECT_EQ(recv.values(), reference::reduce_scatter(inputs(n * kRanks), n, op)[static_cast<size_t>(r)])
            << "reduce_scatter n " << n;

        OnDevice to_root(device, input(r, n)), at_root(device, n);
        c.reduce(to_root.data(), at_root.data(), n, DType::F32, op, 1);
        if (r == 1) {
          EXPECT_EQ(at_root.values(), reference::reduce(inputs(n), op)) << "reduce n " << n;
        }
      }
    }
  });
}

TEST_F(DeviceStaging, DataMovementOnDeviceBuffersEqualsTheSerialReference) {
  run([](Communicator& c, Device device) {
    const int r = c.rank();
    for (int64_t n : kCounts) {
      OnDevice send(device, input(r, n)), gathered(device, n * kRanks);
      c.all_gather(send.data(), gathered.data(), n, DType::F32);
      EXPECT_EQ(gathered.values(), reference::all_gather(inputs(n))) << "all_gather n " << n;

      // Uneven: rank q contributes n + q elements.
      const std::vector<int64_t> counts = {n, n + 1, n + 2};
      reference::Buffers uneven;
      for (int q = 0; q < kRanks; ++q) uneven.push_back(widened(input(q, counts[static_cast<size_t>(q)])));
      OnDevice mine(device, input(r, counts[static_cast<size_t>(r)])), all(device, 3 * n + 3);
      c.all_gather_v(mine.data(), all.data(), counts, DType::F32);
      EXPECT_EQ(all.values(), reference::all_gather(uneven)) << "all_gather_v n " << n;

      OnDevice root_data(device, input(r, n));
      c.broadcast(root_data.data(), n, DType::F32, 2);
      EXPECT_EQ(root_data.values(), widened(input(2, n))) << "broadcast n " << n;

      OnDevice blocks(device, input(r, n * kRanks)), exchanged(device, n * kRanks);
      c.all_to_all(blocks.data(), exchanged.data(), n, DType::F32);
      EXPECT_EQ(exchanged.values(), reference::all_to_all(inputs(n * kRanks), n)[static_cast<size_t>(r)])
          << "all_to_all n " << n;
    }
  });
}

TEST_F(DeviceStaging, AllToAllVAndARingOfSendRecvMoveDeviceBuffers) {
  run([](Communicator& c, Device device) {
    const int r = c.rank();
    // Rank q sends q + p + 1 elements to rank p.
    std::vector<std::vector<int64_t>> all_send_counts(kRanks);
    reference::Buffers all_inputs;
    for (int q = 0; q < kRanks; ++q) {
      for (int p = 0; p < kRanks; ++p) all_send_counts[static_cast<size_t>(q)].push_back(q + p + 1);
      const auto& counts = all_send_counts[static_cast<size_t>(q)];
      all_inputs.push_back(widened(input(q, std::accumulate(counts.begin(), counts.end(), int64_t{0}))));
    }
    const std::vector<int64_t>& send_counts = all_send_counts[static_cast<size_t>(r)];
    std::vector<int64_t> recv_counts;
    for (int q = 0; q < kRanks; ++q) recv_counts.push_back(all_send_counts[static_cast<size_t>(q)][static_cast<size_t>(r)]);
    const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
    const int64_t received = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
    OnDevice send(device, input(r, sent)), recv(device, received);
    c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, DType::F32);
    const std::vector<double> want = reference::all_to_all_v(all_inputs, all_send_counts)[static_cast<size_t>(r)];
    EXPECT_EQ(recv.values(), want);

    // Around the ring, device to device; received before the send is waited for.
    const int next = (r + 1) % kRanks, previous = (r + kRanks - 1) % kRanks;
    OnDevice out(device, input(r, 1009, 3)), in(device, 1009);
    WorkHandle sending = c.send_async(out.data(), 1009, DType::F32, next, 7);
    c.recv(in.data(), 1009, DType::F32, previous, 7);
    sending->wait();
    EXPECT_EQ(in.values(), widened(input(previous, 1009, 3)));
  });
}

TEST_F(DeviceStaging, HostBuffersBesideDeviceOnesAndOperationsWaitedOutOfOrder) {
  run([](Communicator& c, Device device) {
    const int r = c.rank();
    // A host scalar through the staged communicator: untouched by staging.
    float loss = static_cast<float>(r) + 0.5f;
    c.all_reduce(&loss, 1, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(loss, 0.5f + 1.5f + 2.5f);
    // Host send, device receive; device send, host receive.
    std::vector<float> host_send = input(r, 101);
    OnDevice device_recv(device, 101 * kRanks);
    c.all_gather(host_send.data(), device_recv.data(), 101, DType::F32);
    EXPECT_EQ(device_recv.values(), reference::all_gather(inputs(101)));
    OnDevice device_send(device, input(r, 101 * kRanks));
    std::vector<float> host_recv(101);
    c.reduce_scatter(device_send.data(), host_recv.data(), 101, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(widened(host_recv), reference::reduce_scatter(inputs(101 * kRanks), 101, ReduceOp::Sum)[static_cast<size_t>(r)]);
    // Buckets reduced asynchronously and waited for last to first; test() until done copies back too.
    std::vector<std::unique_ptr<OnDevice>> buckets;
    std::vector<WorkHandle> pending;
    for (int b = 0; b < 4; ++b) {
      buckets.push_back(std::make_unique<OnDevice>(device, input(r, 300 + b, b)));
      pending.push_back(c.all_reduce_async(buckets.back()->data(), 300 + b, DType::F32, ReduceOp::Sum));
    }
    while (!pending[3]->test()) {
    }
    for (int b = 2; b >= 0; --b) pending[static_cast<size_t>(b)]->wait();
    pending[3]->wait();  // waiting again is allowed and copies nothing twice
    for (int b = 0; b < 4; ++b) {
      EXPECT_EQ(buckets[static_cast<size_t>(b)]->values(), reference::reduce(inputs(300 + b, b), ReduceOp::Sum)) << b;
    }
  });
}

TEST_F(DeviceStaging, GroupsFromSplitStageTheirDeviceBuffersToo) {
  run([](Communicator& c, Device device) {
    const int r = c.rank();
    // Ranks 0 and 2 in one group, rank 1 alone.
    std::unique_ptr<Communicator> group = c.split(r % 2, r, "pair");
    ASSERT_NE(group, nullptr);
    OnDevice data(device, input(r, 1009));
    group->all_reduce(data.data(), 1009, DType::F32, ReduceOp::Sum);
    std::vector<double> want = widened(input(r, 1009));
    if (r != 1) want = reference::reduce({widened(input(0, 1009)), widened(input(2, 1009))}, ReduceOp::Sum);
    EXPECT_EQ(data.values(), want);
    EXPECT_EQ(group->name(), "pair");
    EXPECT_EQ(c.split(-1, r, "none"), nullptr);
  });
}

// With a device backend (runtime.device_comm = nccl; here the emulated one, which refuses host
// memory): operations on device buffers only go to it, unstaged; host and mixed ones stay on the
// host backend, staged. Results equal the serial reference either way.
TEST_F(DeviceStaging, ADeviceBackendTakesTheOperationsOnDeviceBuffersOnly) {
  ::loom::testing::install_emulated_device_communicator();
  std::atomic<int64_t> device_ops_per_rank{0};
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = kRanks;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    const int r = world.rank();
    const Device device = device_of(r);
    std::unique_ptr<Communicator> routed = route_device_buffers(world, device, options.comm);
    world.barrier();
    const int64_t before = ::loom::testing::emulated_device_operations();
    world.barrier();
    OnDevice data(device, input(r, 1009));
    routed->all_reduce(data.data(), 1009, DType::F32, ReduceOp::Sum);  // device: the device backend
    EXPECT_EQ(data.values(), reference::reduce(inputs(1009), ReduceOp::Sum));
    std::unique_ptr<Communicator> group = routed->split(0, r, "all");  // splits both backends
    OnDevice send(device, input(r, 10)), gathered(device, 10 * kRanks);
    group->all_gather(send.data(), gathered.data(), 10, DType::F32);  // device: the device backend
    EXPECT_EQ(gathered.values(), reference::all_gather(inputs(10)));
    float loss = static_cast<float>(r);
    routed->all_reduce(&loss, 1, DType::F32, ReduceOp::Sum);  // host: the host backend
    EXPECT_EQ(loss, 3.0f);
    std::vector<float> host_send = input(r, 10);
    OnDevice mixed(device, 10 * kRanks);
    routed->all_gather(host_send.data(), mixed.data(), 10, DType::F32);  // mixed: staged, the host backend
    EXPECT_EQ(mixed.values(), reference::all_gather(inputs(10)));
    world.barrier();
    if (r == 0) device_ops_per_rank = (::loom::testing::emulated_device_operations() - before) / kRanks;
    world.barrier();
  });
  EXPECT_EQ(device_ops_per_rank, 2);  // the device all_reduce and all_gather of each rank
}

}  // namespace
}  // namespace loom::comm
