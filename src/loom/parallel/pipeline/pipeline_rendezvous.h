#pragma once
// Checking a pipeline schedule's instruction lists under NCCL's point-to-point semantics, as the
// executor (pipeline_step.h) runs them there:
// - consecutive message instructions of a list go as one batch (one NCCL group), and a rank's
//   batches run one after another in issue order, each to completion before the next starts;
// - a send completes only when the peer's batch holding the matching recv runs (rendezvous: no
//   eager buffer, the case of large messages), so a batch completes once every peer it
//   exchanges with runs the batch holding the other end of each of its messages;
// - no tags: the messages from one rank to another pair in issue order, so the k-th send from
//   a to b must be what b's k-th recv from a expects (else the data would land in the wrong
//   buffer);
// - a rank waits for a batch that receives before going on (its data is needed next), and for
//   all its batches at the gradient reduction; a batch of sends only is left running.
// simulate_pipeline (pipeline_simulation.h) checks the same lists with buffered sends (the
// threads and mpi backends), under which fewer orders deadlock.
#include "loom/parallel/pipeline/pipeline_schedule.h"

namespace loom::parallel {

// Throws loom::Error naming the first message pairing that mismatches, or every rank's blocked
// batch when the lists deadlock.
void check_rendezvous(const PipelineSchedule& schedule);

}  // namespace loom::parallel
