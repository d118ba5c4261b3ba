#include "loom/comm/mpi/communicator.h"

#include "loom/comm/mpi/transfer.h"

namespace loom::comm::mpi_detail {

MpiCommunicator::~MpiCommunicator() { group_->close(std::uncaught_exceptions() > 0); }

WorkHandle MpiCommunicator::issue(CollectiveCall call, Transfer transfer) {
  auto op = std::make_shared<CollectiveOp>();
  op->invalid = argument_problem(call, rank(), size());
  if (!op->invalid.empty()) {
    // The handshake of the v forms exchanges one count per rank.
    const auto ranks = static_cast<size_t>(size());
    if (call.kind == CollectiveKind::AllGatherV || call.kind == CollectiveKind::AllToAllV) call.counts.assign(ranks, 0);
    if (call.kind == CollectiveKind::AllToAllV) call.recv_counts.assign(ranks, 0);
  }
  op->call = std::move(call);
  op->transfer = std::move(transfer);
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) {
  return issue(CollectiveCall::all_reduce(data, count, dtype, op), transfer::all_reduce);
}

WorkHandle MpiCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                 ReduceOp op) {
  return issue(CollectiveCall::reduce_scatter(send, recv, recv_count, dtype, op), transfer::reduce_scatter);
}

WorkHandle MpiCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) {
  return issue(CollectiveCall::all_gather(send, recv, send_count, dtype), transfer::all_gather);
}

WorkHandle MpiCommunicator::all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                               DType dtype) {
  return issue(CollectiveCall::all_gather_v(send, recv, counts, dtype), transfer::all_gather);
}

WorkHandle MpiCommunicator::broadcast_async(void* data, int64_t count, DType dtype, int root) {
  return issue(CollectiveCall::broadcast(data, count, dtype, root), transfer::broadcast);
}

WorkHandle MpiCommunicator::reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                         int root) {
  return issue(CollectiveCall::reduce(send, recv, count, dtype, op, root), transfer::reduce);
}

WorkHandle MpiCommunicator::all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) {
  return issue(CollectiveCall::all_to_all(send, recv, count, dtype), transfer::all_to_all);
}

WorkHandle MpiCommunicator::all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                               std::span<const int64_t> recv_counts, DType dtype) {
  return issue(CollectiveCall::all_to_all_v(send, send_counts, recv, recv_counts, dtype), transfer::all_to_all);
}

WorkHandle MpiCommunicator::barrier_async() { return issue(CollectiveCall::barrier(), transfer::barrier); }

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  auto child = std::make_shared<std::unique_ptr<Communicator>>();
  issue(CollectiveCall::split(color, key, name),
        [child](Group& group, CollectiveOp& op) { *child = split_group(group, op); })
      ->wait();
  return std::move(*child);
}

WorkHandle MpiCommunicator::send_async(const void* data, int64_t count, DType dtype, int peer, int tag) {
  return group_->issue_p2p(true, const_cast<void*>(data), count, dtype, peer, tag);
}

WorkHandle MpiCommunicator::recv_async(void* data, int64_t count, DType dtype, int peer, int tag) {
  return group_->issue_p2p(false, data, count, dtype, peer, tag);
}

}  // namespace loom::comm::mpi_detail
