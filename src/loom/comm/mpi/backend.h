#pragma once
// The `mpi` backend: this process is one rank of an mpirun / srun job. Every group is an MPI
// communicator of its own (MPI_Comm_dup / MPI_Comm_split) and the data moves with MPI's own
// collectives. How operations run, wait, time out and detect mismatches: mpi/group.h.
#include <climits>
#include <cstdint>
#include <functional>
#include <string>

#include "loom/comm/communicator.h"
#include "loom/comm/launch.h"

namespace loom::comm {

// Initialises MPI (MPI_THREAD_MULTIPLE), runs `body` with the world communicator and finalises.
// An exception escaping `body` on some rank: when every rank finishes `body` within a few
// seconds (the error was collective, e.g. a mismatch every rank detected), MPI is finalised and
// the error is rethrown on the ranks that raised it ("rank k failed" on the others). Otherwise
// the error is printed naming this rank and the job is aborted (MPI_Abort), so that no rank
// waits forever for one that is gone.
void run_mpi(const LaunchOptions& options, const std::function<void(Communicator& world)>& body);

// Settings of one mpi-backend group. Every member must use the same settings (they change what
// travels on the wire); groups made by split() inherit their parent's.
struct MpiOptions {
  CommOptions comm;
  // Before its data moves, every collective all-reduces a small descriptor (operation, dtype,
  // count, reduce op, root): ranks that disagree get an Error naming each rank's view, and the
  // descriptor doubles as the arrival handshake that a timeout can abandon, so the data can then
  // move with MPI's blocking collectives. Off: one small all-reduce less per collective, but a
  // mismatch is undefined behaviour in MPI, and a rank that skips a collective leaves its
  // peers' communication thread blocked in MPI (their waits still time out, naming it).
  bool check_agreement = true;
  // Elements per MPI call (MPI counts are int); larger operations are split. Tests lower it.
  int64_t max_elements_per_call = INT_MAX;
  // Keep arrival counters in a shared-memory window when the whole group is on one node (read
  // with plain loads); otherwise, or when false, in an RMA window read with MPI_Rget. Takes
  // effect for groups created afterwards.
  bool shared_memory_counters = true;
};

// Throws loom::Error when `comm` is not an mpi-backend communicator.
MpiOptions mpi_options(const Communicator& comm);
// Applies to operations issued afterwards. Every member must set the same options at the same
// point of its sequence of operations on the group.
void set_mpi_options(Communicator& comm, const MpiOptions& options);
// How `comm` keeps its arrival counters: "shared-memory window", "rma window" or
// "unavailable: <why>".
std::string mpi_arrival_counters(const Communicator& comm);

}  // namespace loom::comm
