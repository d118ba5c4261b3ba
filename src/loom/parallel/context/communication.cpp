#include "loom/parallel/context/communication.h"

#include <vector>

#include "loom/parallel/context/ulysses_layout.h"

namespace loom::parallel {

namespace {
thread_local int64_t bytes_sent = 0;
}  // namespace

int64_t context_bytes_sent() { return bytes_sent; }

void exchange_all_to_all(comm::Communicator& cp, const float* send, float* recv, int64_t count) {
  bytes_sent += (cp.size() - 1) * count * static_cast<int64_t>(sizeof(float));
  cp.all_to_all(send, recv, count, DType::F32);
}

void gather_documents(comm::Communicator& cp, const int32_t* mine, int32_t* all, int64_t count) {
  bytes_sent += count * static_cast<int64_t>(sizeof(int32_t));
  cp.all_gather(mine, all, count, DType::I32);
}

void gather_sequences(comm::Communicator& cp, const int32_t* mine, int32_t* whole, int64_t batch, int64_t local_seq) {
  std::vector<int32_t> blocks(static_cast<size_t>(cp.size() * batch * local_seq));
  gather_documents(cp, mine, blocks.data(), batch * local_seq);
  blocks_to_sequence(whole, blocks.data(), batch, local_seq, cp.size());
}

RingHop::RingHop(comm::Communicator& cp, const float* send, float* recv, int64_t count, int tag) {
  const int next = (cp.rank() + 1) % cp.size(), previous = (cp.rank() + cp.size() - 1) % cp.size();
  // One batch: every rank sends before it receives, which only a batch's pairing survives
  // where a send waits for its receive (NCCL).
  const comm::PeerOp ops[] = {comm::PeerOp::send(send, count, DType::F32, next, tag),
                              comm::PeerOp::recv(recv, count, DType::F32, previous, tag)};
  work_ = comm::all_of(cp.exchange_async(ops));
  bytes_sent += count * static_cast<int64_t>(sizeof(float));
}

void RingHop::wait() { work_->wait_in_stream(); }

}  // namespace loom::parallel
