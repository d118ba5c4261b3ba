#pragma once
// Checking and simulating a pipeline schedule (pipeline_schedule.h) before any rank runs it.
//
// simulate_pipeline executes every rank's instruction list as the executor does: sends never
// block, a receive waits until its message was sent. It proves the lists deadlock-free (a state
// where every unfinished rank waits on a message nobody will send is an Error listing each
// rank's blocked instruction), checks that every message sent is received exactly once, that
// every chunk of every micro-batch runs its forward once and its backward once after it, and
// that the gradient reduction comes last; then that the lists also run where a send waits for
// its recv (check_rendezvous, pipeline_rendezvous.h: NCCL's semantics). With costs per pass it
// also times the schedule: per-rank busy and idle time (the bubble) and the most micro-batches
// whose activations a rank holds at once.
#include <string>
#include <vector>

#include "loom/parallel/pipeline/pipeline_schedule.h"

namespace loom::parallel {

struct PipelineCosts {
  double forward = 1.0;   // one micro-batch through one whole stage (all v chunks)
  double backward = 2.0;  // its backward; a chunk costs 1/v of each
};

struct PipelineSlot {
  double start = 0.0, end = 0.0;
  PipelineInstruction instruction;  // Forward or Backward
};

struct PipelineSimulation {
  double makespan = 0.0;
  std::vector<double> busy, idle;          // per rank
  std::vector<int> peak_in_flight;         // per rank: chunks forwarded and not yet backwarded
  std::vector<std::vector<PipelineSlot>> timeline;  // per rank, in time order
  // Mean over ranks of idle / busy: (p - 1) / m for GPipe and 1F1B, (p - 1) / (v m) interleaved.
  double bubble_fraction() const;
};

// Throws loom::Error describing the first violation.
PipelineSimulation simulate_pipeline(const PipelineSchedule& schedule, PipelineCosts costs = {});

// The timeline as text, one row per rank and one column per forward-chunk time: "F3" forward of
// micro-batch 3 (chunk letter a, b, ... when interleaved), "B3" its backward, '.' idle; then
// each rank's bubble and peak activations.
std::string render_pipeline_timeline(const PipelineSchedule& schedule, const PipelineSimulation& simulation,
                                     PipelineCosts costs = {});

}  // namespace loom::parallel
