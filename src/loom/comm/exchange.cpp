// The batched point-to-point operation's default (Communicator::exchange_async), and all_of.
#include <utility>

#include "loom/comm/communicator.h"

namespace loom::comm {

namespace {

class AllOfWork final : public Work {
 public:
  explicit AllOfWork(std::vector<WorkHandle> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (WorkHandle& part : parts_) part->wait();
  }
  void wait_in_stream() override {
    for (WorkHandle& part : parts_) part->wait_in_stream();
  }
  bool test() override {
    bool done = true;
    for (WorkHandle& part : parts_) done = part->test() && done;  // polls every part: each may progress
    return done;
  }

 private:
  std::vector<WorkHandle> parts_;
};

}  // namespace

WorkHandle all_of(std::vector<WorkHandle> parts) { return std::make_shared<AllOfWork>(std::move(parts)); }

// Every op is posted before any is waited for; with a backend whose send_async returns without
// waiting for the peer (threads queues it for the receiver, mpi posts an MPI_Isend), the batch's
// messages then match whatever their order here and on the peers.
std::vector<WorkHandle> Communicator::exchange_async(std::span<const PeerOp> ops) {
  std::vector<WorkHandle> parts;
  parts.reserve(ops.size());
  for (const PeerOp& op : ops) {
    parts.push_back(op.is_send() ? send_async(op.data, op.count, op.dtype, op.peer, op.tag)
                                 : recv_async(op.data, op.count, op.dtype, op.peer, op.tag));
  }
  return parts;
}

}  // namespace loom::comm
