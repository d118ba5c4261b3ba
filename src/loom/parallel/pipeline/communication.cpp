#include "loom/parallel/pipeline/communication.h"

namespace loom::parallel {

void receive_activations(comm::Communicator& pp, float* buffer, int64_t count, const PipelineMessage& message) {
  pp.recv_async(buffer, count, DType::F32, message.peer, message.tag)->wait();
}

comm::WorkHandle start_send_activations(comm::Communicator& pp, const float* buffer, int64_t count,
                                        const PipelineMessage& message) {
  return pp.send_async(buffer, count, DType::F32, message.peer, message.tag);
}

double share_loss(comm::Communicator& pp, double loss, int root) {
  // A double's 8 bytes, as they are.
  double shared = loss;
  pp.broadcast(&shared, 1, DType::I64, root);
  return shared;
}

}  // namespace loom::parallel
