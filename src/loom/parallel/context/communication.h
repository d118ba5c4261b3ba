#pragma once
// Every message of context parallelism: the all-to-all of Ulysses attention and the ring of
// ring attention. ulysses_attention.cpp and ring_attention.cpp call these and no Communicator
// method directly.
#include <cstdint>

#include "loom/comm/communicator.h"

namespace loom::parallel {

// Bytes this thread (a rank: of the threads backend, or an MPI process's) has sent through the
// functions below since it started; what leaves for another rank, not the own block of an
// all-to-all. For measurements (bench/context_bench.cpp).
int64_t context_bytes_sent();

// Block r of `send` (count floats) goes to rank r of the group; block r of `recv` comes from it.
void exchange_all_to_all(comm::Communicator& cp, const float* send, float* recv, int64_t count);

// Every rank's `count` document ids, in rank order (packed documents: who sees whom).
void gather_documents(comm::Communicator& cp, const int32_t* mine, int32_t* all, int64_t count);

// Every rank's token ids of `batch` sequences of `local_seq` (its load-balanced chunks), as
// whole sequences in natural order: whole = [batch, cp * local_seq] (ContextAttention's
// gather_sequences).
void gather_sequences(comm::Communicator& cp, const int32_t* mine, int32_t* whole, int64_t batch, int64_t local_seq);

// One hop of the ring: `send` to the next rank (rank + 1), `recv` from the previous one, as one
// batch (Communicator::exchange_async); both buffers must stay valid until wait(), which returns
// when the received block is ready for the calling thread's later work (Work::wait_in_stream).
class RingHop {
 public:
  RingHop(comm::Communicator& cp, const float* send, float* recv, int64_t count, int tag);
  void wait();

 private:
  comm::WorkHandle work_;
};

}  // namespace loom::parallel
