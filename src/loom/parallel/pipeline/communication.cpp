#include "loom/parallel/pipeline/communication.h"

#include <vector>

namespace loom::parallel {

std::vector<comm::WorkHandle> start_stage_messages(comm::Communicator& pp, std::span<const StageMessage> messages) {
  std::vector<comm::PeerOp> ops;
  for (const StageMessage& m : messages) {
    ops.push_back(m.send != nullptr ? comm::PeerOp::send(m.send, m.count, DType::F32, m.message.peer, m.message.tag)
                                    : comm::PeerOp::recv(m.recv, m.count, DType::F32, m.message.peer, m.message.tag));
  }
  return pp.exchange_async(ops);
}

double share_loss(comm::Communicator& pp, double loss, int root) {
  // A double's 8 bytes, as they are.
  double shared = loss;
  pp.broadcast(&shared, 1, DType::I64, root);
  return shared;
}

}  // namespace loom::parallel
