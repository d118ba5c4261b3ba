#pragma once
// The mpi backend's Communicator: a front for one Group (group.h). Each collective only
// describes its arguments (a CollectiveCall) and the MPI call it runs (a Transfer); issue() is
// the one path they all take.
#include <memory>
#include <span>
#include <string>

#include "loom/comm/arguments.h"
#include "loom/comm/communicator.h"
#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<Group> group) : group_(std::move(group)) {}
  ~MpiCommunicator() override;

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  const std::vector<int>& world_ranks() const override { return group_->world_ranks(); }
  std::string backend() const override { return "mpi"; }

  WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                  ReduceOp op) override;
  WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override;
  WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                DType dtype) override;
  WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override;
  WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                          int root) override;
  WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override;
  WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                std::span<const int64_t> recv_counts, DType dtype) override;
  WorkHandle barrier_async() override;
  WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  Group& group() { return *group_; }
  const Group& group() const { return *group_; }

 private:
  // Checks `call`'s arguments (an invalid one fails in the handshake, on every rank alike) and
  // issues it on the group with `transfer` as its data movement.
  WorkHandle issue(CollectiveCall call, Transfer transfer);

  std::shared_ptr<Group> group_;
};

}  // namespace loom::comm::mpi_detail
