#pragma once
// The `threads` backend: N ranks as threads of this process, sharing memory. The embedded
// default (runtime.backend=threads, runtime.ranks=N); launch() calls run_threads().
//
// How it works (details in threads/group.h and threads/collectives.h):
// - Each rank has, per group it uses, a queue of collectives run one at a time in issue order by
//   a progress thread, so *_async returns at once and the collective runs while the caller
//   computes; groups progress independently. A caller that waits while nothing runs runs the
//   front of the queue itself (blocking calls then cost no thread hand-off).
// - Collectives are shared-memory algorithms: the ranks exchange buffer addresses and read each
//   other's memory. Small inputs (<= 64 KiB) are copied into shared memory first and need one
//   rendezvous; a large all-reduce is reduce-scatter + all-gather over chunks, each rank
//   reducing its own slice (each rank moves ~2x the data). bf16/f16 reduce in f32, round once.
//   Every element is reduced in rank order, so all ranks get bitwise the same result.
// - send/recv match on (source, destination, tag) in issue order; the receiver's copy thread
//   copies from the sender's buffer, and the send completes when that copy is done.
// - Waits time out after CommOptions::timeout naming the group, the operation, its sequence
//   number and the ranks that never arrived; ranks disagreeing on an operation fail on every
//   rank with each rank's view; a failure makes the group unusable (later ops fail at once).
// - An exception escaping a rank's body aborts the world: every wait not yet satisfied throws,
//   naming that rank; run_threads() rethrows the first exception once all threads ended.
// - With LaunchOptions::link_model set, the thread doing each inter-rank copy first reports it
//   (source, destination world ranks, bytes) to the model, which may delay it.
//
// Buffers given to an operation must stay valid until it completed (wait() returned), as with
// MPI; a communicator's destructor waits for its queued operations.
#include <functional>

#include "loom/comm/communicator.h"
#include "loom/comm/launch.h"

namespace loom::comm {

// Runs `body(world)` on options.ranks threads (group "world", ranks 0..N-1) and returns when all
// have ended; rethrows the first exception any rank raised.
void run_threads(const LaunchOptions& options, const std::function<void(Communicator& world)>& body);

}  // namespace loom::comm
