#pragma once
// A device backend for the emulated CUDA device (emulated_cuda.h), standing in for NCCL in tests
// of runtime.device_comm = nccl: a group of the same ranks (split from the bootstrap) that takes
// device memory only (a host pointer is an Error naming the operation and argument, where NCCL
// would fault), untags the pointers and runs the wrapped host group's collective. It counts the
// operations it ran, so a test can tell that device buffers went its way. Test support only.
#include <atomic>
#include <memory>
#include <string>

#include "loom/comm/communicator.h"
#include "loom/comm/device_staging.h"
#include "loom/core/error.h"
#include "support/emulated_cuda.h"
#include "support/rendezvous_comm.h"

namespace loom::testing {

inline std::atomic<int64_t>& emulated_device_operations() {
  static std::atomic<int64_t> count{0};
  return count;
}

class EmulatedDeviceCommunicator final : public comm::Communicator {
 public:
  explicit EmulatedDeviceCommunicator(std::unique_ptr<comm::Communicator> group) : group_(std::move(group)) {}

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  const std::vector<int>& world_ranks() const override { return group_->world_ranks(); }
  std::string backend() const override { return "emulated-device"; }

  comm::WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, comm::ReduceOp op) override {
    return counted(group_->all_reduce_async(device(data, "all_reduce's data"), count, dtype, op));
  }
  comm::WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                        comm::ReduceOp op) override {
    return counted(group_->reduce_scatter_async(device(send, "reduce_scatter's send"), device(recv, "reduce_scatter's recv"),
                                                recv_count, dtype, op));
  }
  comm::WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return counted(
        group_->all_gather_async(device(send, "all_gather's send"), device(recv, "all_gather's recv"), send_count, dtype));
  }
  comm::WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts, DType dtype) override {
    return counted(
        group_->all_gather_v_async(device(send, "all_gather_v's send"), device(recv, "all_gather_v's recv"), counts, dtype));
  }
  comm::WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    return counted(group_->broadcast_async(device(data, "broadcast's data"), count, dtype, root));
  }
  comm::WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                                int root) override {
    return counted(group_->reduce_async(device(send, "reduce's send"), device(recv, "reduce's recv"), count, dtype, op, root));
  }
  comm::WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    return counted(group_->all_to_all_async(device(send, "all_to_all's send"), device(recv, "all_to_all's recv"), count, dtype));
  }
  comm::WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                      std::span<const int64_t> recv_counts, DType dtype) override {
    return counted(group_->all_to_all_v_async(device(send, "all_to_all_v's send"), send_counts,
                                              device(recv, "all_to_all_v's recv"), recv_counts, dtype));
  }
  comm::WorkHandle barrier_async() override { return counted(group_->barrier_async()); }
  comm::WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return counted(group_->send_async(device(data, "send's data"), count, dtype, peer, tag));
  }
  comm::WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return counted(group_->recv_async(device(data, "recv's data"), count, dtype, peer, tag));
  }
  std::vector<comm::WorkHandle> exchange_async(std::span<const comm::PeerOp> ops) override {
    std::vector<comm::PeerOp> host(ops.begin(), ops.end());
    for (comm::PeerOp& op : host) op.data = device(op.data, op.is_send() ? "exchange's send" : "exchange's recv");
    ++emulated_device_operations();
    return group_->exchange_async(host);
  }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<comm::Communicator> group = group_->split(color, key, name);
    return group ? std::make_unique<EmulatedDeviceCommunicator>(std::move(group)) : nullptr;
  }

 private:
  template <typename T>
  static T* device(T* p, const char* what) {
    if (p == nullptr) return p;
    LOOM_CHECK(is_emulated_device_pointer(p), std::string("emulated device backend: ") + what + " is host memory");
    return emulated_host_view(p);
  }
  static comm::WorkHandle counted(comm::WorkHandle work) {
    ++emulated_device_operations();
    return work;
  }

  std::unique_ptr<comm::Communicator> group_;
};

// Registers the emulated device backend as the device communicator factory (runtime.device_comm
// = nccl): a group split from the bootstrap, one color, ranks in order.
// `rendezvous`: with NCCL's point-to-point semantics too (rendezvous_comm.h: one operation at a
// time, a send waits for the peer's recv, messages between two ranks match in issue order).
inline void install_emulated_device_communicator(bool rendezvous = false) {
  comm::set_device_communicator_factory([rendezvous](comm::Communicator& bootstrap, Device, const comm::CommOptions&) {
    std::unique_ptr<comm::Communicator> group = bootstrap.split(0, bootstrap.rank(), bootstrap.name());
    if (rendezvous) group = std::make_unique<RendezvousCommunicator>(std::move(group));
    return std::make_unique<EmulatedDeviceCommunicator>(std::move(group));
  });
}

}  // namespace loom::testing
