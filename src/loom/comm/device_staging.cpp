#include "loom/comm/device_staging.h"

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <list>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace {

int64_t total(std::span<const int64_t> counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

// The host side of one operation's buffers: inputs copied in at issue, outputs copied back to
// the device once the wrapped operation is done.
class Staging {
 public:
  // `stage` false: every buffer passes through as it is (a device backend's operation).
  Staging(Device device, bool stage) : device_(device), stage_(stage) {}

  // A host pointer for an input of `count` elements: itself when it is host memory.
  const void* input(const void* data, int64_t count, DType dtype) {
    if (!on_device(data) || count <= 0) return data;
    std::vector<std::byte>& host = buffer(count, dtype);
    allocator(device_).to_host(host.data(), data, host.size());
    return host.data();
  }
  // A host pointer for an output of `count` elements, copied back by finish(). `read_first`: the
  // operation also reads it (in place: all_reduce, broadcast's root).
  void* output(void* data, int64_t count, DType dtype, bool read_first) {
    if (!on_device(data) || count <= 0) return data;
    std::vector<std::byte>& host = buffer(count, dtype);
    if (read_first) allocator(device_).to_host(host.data(), data, host.size());
    outputs_.push_back({data, &host});
    return host.data();
  }
  bool empty() const { return buffers_.empty(); }
  void finish() {
    for (const Output& o : outputs_) allocator(device_).from_host(o.device, o.host->data(), o.host->size());
    outputs_.clear();
  }

 private:
  struct Output {
    void* device;
    std::vector<std::byte>* host;
  };
  bool on_device(const void* data) const { return stage_ && data != nullptr && allocator(device_).holds(data); }
  std::vector<std::byte>& buffer(int64_t count, DType dtype) {
    // A list, not a vector of vectors: the addresses handed out stay valid as more are added.
    buffers_.emplace_back(static_cast<size_t>(count) * dtype_size(dtype));
    return buffers_.back();
  }

  Device device_;
  bool stage_;
  std::list<std::vector<std::byte>> buffers_;
  std::vector<Output> outputs_;
};

class StagedWork final : public Work {
 public:
  StagedWork(std::unique_ptr<Staging> staging, WorkHandle inner) : staging_(std::move(staging)), inner_(std::move(inner)) {}
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    if (!inner_->test()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    std::lock_guard lock(mutex_);
    if (staging_) staging_->finish();
    staging_.reset();
  }
  std::mutex mutex_;
  std::unique_ptr<Staging> staging_;
  WorkHandle inner_;
};

// Operations whose buffers are all device memory go to `device_comm` when there is one;
// every other operation goes to `inner`, its device buffers staged through the host.
class DeviceStagingCommunicator final : public Communicator {
 public:
  DeviceStagingCommunicator(Communicator& inner, std::unique_ptr<Communicator> owned, Device device,
                            std::unique_ptr<Communicator> device_comm)
      : inner_(inner), owned_(std::move(owned)), device_(device), device_comm_(std::move(device_comm)) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const std::string& name() const override { return inner_.name(); }
  const std::vector<int>& world_ranks() const override { return inner_.world_ranks(); }
  std::string backend() const override { return inner_.backend(); }

  WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    return run({data}, [&](Communicator& c, Staging& s) { return c.all_reduce_async(s.output(data, count, dtype, true), count, dtype, op); });
  }
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) override {
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.reduce_scatter_async(s.input(send, recv_count * size(), dtype),
                                         s.output(recv, recv_count, dtype, false), recv_count, dtype, op);
    });
  }
  WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.all_gather_async(s.input(send, send_count, dtype), s.output(recv, send_count * size(), dtype, false),
                                     send_count, dtype);
    });
  }
  WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts, DType dtype) override {
    const int64_t own = rank() < static_cast<int>(counts.size()) ? counts[static_cast<size_t>(rank())] : 0;
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.all_gather_v_async(s.input(send, own, dtype), s.output(recv, total(counts), dtype, false), counts, dtype);
    });
  }
  WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    return run({data}, [&](Communicator& c, Staging& s) {
      return c.broadcast_async(s.output(data, count, dtype, rank() == root), count, dtype, root);
    });
  }
  WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) override {
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.reduce_async(s.input(send, count, dtype), s.output(recv, rank() == root ? count : 0, dtype, false),
                                 count, dtype, op, root);
    });
  }
  WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.all_to_all_async(s.input(send, count * size(), dtype), s.output(recv, count * size(), dtype, false),
                                     count, dtype);
    });
  }
  WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                std::span<const int64_t> recv_counts, DType dtype) override {
    return run({send, recv}, [&](Communicator& c, Staging& s) {
      return c.all_to_all_v_async(s.input(send, total(send_counts), dtype), send_counts,
                                       s.output(recv, total(recv_counts), dtype, false), recv_counts, dtype);
    });
  }
  WorkHandle barrier_async() override { return inner_.barrier_async(); }  // no buffers: the host backend
  WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return run({data}, [&](Communicator& c, Staging& s) { return c.send_async(s.input(data, count, dtype), count, dtype, peer, tag); });
  }
  WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return run({data}, [&](Communicator& c, Staging& s) { return c.recv_async(s.output(data, count, dtype, false), count, dtype, peer, tag); });
  }
  // One batch on one backend: the device one when every buffer is device memory, so its sends and
  // recvs stay one group there (NCCL); else the host one, each op's device buffer staged on its
  // own (a recv's data comes back when that recv completes, whatever the batch's sends).
  std::vector<WorkHandle> exchange_async(std::span<const PeerOp> ops) override {
    if (device_comm_ && all_on_device(ops)) return device_comm_->exchange_async(ops);
    std::vector<std::unique_ptr<Staging>> stagings;
    std::vector<PeerOp> staged(ops.begin(), ops.end());
    for (PeerOp& op : staged) {
      stagings.push_back(std::make_unique<Staging>(device_, true));
      Staging& s = *stagings.back();
      op.data = op.is_send() ? const_cast<void*>(s.input(op.data, op.count, op.dtype))
                             : s.output(op.data, op.count, op.dtype, false);
    }
    std::vector<WorkHandle> works = inner_.exchange_async(staged);
    for (size_t k = 0; k < works.size(); ++k) {
      if (!stagings[k]->empty()) works[k] = std::make_shared<StagedWork>(std::move(stagings[k]), works[k]);
    }
    return works;
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<Communicator> group = inner_.split(color, key, name);
    std::unique_ptr<Communicator> device_group = device_comm_ ? device_comm_->split(color, key, name) : nullptr;
    if (!group) return nullptr;
    Communicator& inner = *group;
    return std::make_unique<DeviceStagingCommunicator>(inner, std::move(group), device_, std::move(device_group));
  }

 private:
  // Runs `issue` on the device backend when every buffer of the operation is device memory (null
  // ones aside; the ranks of an operation pass the same kinds of buffers, as SPMD code does),
  // else on the host backend with a fresh staging; an operation that staged nothing is returned
  // as the backend's.
  WorkHandle run(std::initializer_list<const void*> buffers, const std::function<WorkHandle(Communicator&, Staging&)>& issue) {
    if (device_comm_ && all_on_device(buffers)) {
      Staging pass_through(device_, false);
      return issue(*device_comm_, pass_through);
    }
    auto staging = std::make_unique<Staging>(device_, true);
    WorkHandle inner = issue(inner_, *staging);
    if (staging->empty()) return inner;
    return std::make_shared<StagedWork>(std::move(staging), std::move(inner));
  }
  bool all_on_device(std::span<const PeerOp> ops) const {
    std::vector<const void*> buffers;
    for (const PeerOp& op : ops) buffers.push_back(op.data);
    return all_on_device(buffers);
  }
  bool all_on_device(std::initializer_list<const void*> buffers) const {
    return all_on_device(std::span<const void* const>(buffers.begin(), buffers.size()));
  }
  bool all_on_device(std::span<const void* const> buffers) const {
    bool any = false;
    for (const void* b : buffers) {
      if (b == nullptr) continue;
      if (!allocator(device_).holds(b)) return false;
      any = true;
    }
    return any;
  }

  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;  // groups made by split()
  Device device_;
  std::unique_ptr<Communicator> device_comm_;  // the device backend's group (NCCL), if any
};

DeviceCommunicatorFactory& device_communicator_factory() {
  static DeviceCommunicatorFactory factory;
  return factory;
}

}  // namespace

std::unique_ptr<Communicator> stage_device_buffers(Communicator& inner, Device device) {
  LOOM_CHECK(device.is_cuda(), "stage_device_buffers: " + device.name() + " is not a device whose memory needs staging");
  return std::make_unique<DeviceStagingCommunicator>(inner, nullptr, device, nullptr);
}

void set_device_communicator_factory(DeviceCommunicatorFactory factory) {
  device_communicator_factory() = std::move(factory);
}

std::unique_ptr<Communicator> route_device_buffers(Communicator& inner, Device device, const CommOptions& options) {
  LOOM_CHECK(device.is_cuda(), "route_device_buffers: " + device.name() + " is not a GPU");
  const DeviceCommunicatorFactory& factory = device_communicator_factory();
  LOOM_CHECK(factory != nullptr, "runtime.device_comm=nccl: this build has no NCCL backend (the CUDA toolkit's NCCL was "
                                 "not found when it was built); use runtime.device_comm=host");
  std::unique_ptr<Communicator> device_comm = factory(inner, device, options);
  return std::make_unique<DeviceStagingCommunicator>(inner, nullptr, device, std::move(device_comm));
}

}  // namespace loom::comm
