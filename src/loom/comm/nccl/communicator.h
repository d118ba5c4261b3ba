#pragma once
// The `nccl` backend of Communicator: each rank drives one GPU, and every collective and
// send/recv runs as an NCCL call on the rank's communication stream. Buffers are device memory
// of that GPU. Ordering with computation: each operation first makes the communication stream
// wait for the work already issued on the calling thread's compute stream (an event; the stream
// of its compute queue, kernels/cuda/compute_streams.h, as kernels/cuda's entries use), and
// wait() blocks the host until the operation's completion event, polling so that
// CommOptions::timeout holds: on timeout the NCCL communicator is aborted and a loom::Error names
// the group, the operation and its sequence number. test() polls the event. wait_in_stream()
// makes the calling thread's compute stream wait for that event and returns at once; the process's
// watchdog (comm/watchdog.h) then keeps the timeout and NCCL's asynchronous errors, and on either
// ends the process with status 1, naming the operation (the compute stream may already have read
// the result NCCL never wrote). Failures NCCL reports
// asynchronously are checked on every wait and abort the communicator too; once aborted, every
// pending and later operation of the group is an Error (an aborted communicator's events complete
// without the data). NCCL groups (ncclGroupStart/End) are closed on every path, so an error inside
// one cannot leave the thread's later NCCL calls stranded in an open group; a group destroyed with
// work still queued is aborted rather than destroyed (destroying waits for that work, which may
// never finish).
//
// Where NCCL differs from the other backends' semantics (communicator.h), plainly:
// - bf16/f16 sums are NCCL's (reduced in the element type along the ring or tree), not
//   accumulated in f32 with one rounding at the end;
// - ranks that disagree on an operation are not detected (NCCL has no handshake): the wait times
//   out instead of naming each rank's view;
// - send/recv tags are not matched: messages between two ranks pair up in issue order, and NCCL
//   runs one operation at a time per communicator, so two ranks that both send before they
//   receive wait for each other: exchange_async issues such sends and recvs as one NCCL group
//   (ncclGroupStart/End), whose operations progress together (as all_to_all_v's do);
// - NCCL refuses two ranks on one GPU: several ranks sharing a GPU use the threads backend.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm {

// Ranks of one process, rank r on GPU devices[r] (ncclCommInitAll), as one group `name`.
std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices,
                                                                   const std::string& name = "world",
                                                                   const CommOptions& options = {});

// One rank per process (mpirun / srun, one process per GPU): rank 0 of `bootstrap` (any backend,
// e.g. the mpi world) makes NCCL's unique id and broadcasts it over `bootstrap`; this rank drives
// `device`. Collective over `bootstrap`; the group has its ranks and size.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     const std::string& name = "world",
                                                     const CommOptions& options = {});

}  // namespace loom::comm
