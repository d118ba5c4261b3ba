// Pipeline schedules under NCCL's point-to-point semantics (pipeline_rendezvous.h): every
// schedule's lists of many shapes run to the end where a send waits for its recv and messages
// pair in issue order, and the checker rejects lists that deadlock or pair the wrong messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "loom/core/error.h"
#include "loom/parallel/pipeline/pipeline_rendezvous.h"
#include "loom/parallel/pipeline/pipeline_schedule.h"

namespace loom::parallel {
namespace {

using Kind = PipelineScheduleKind;

void expect_rejected(const PipelineSchedule& s, const std::string& needle) {
  try {
    check_rendezvous(s);
    ADD_FAILURE() << "accepted lists that cannot run under rendezvous semantics (" << needle << ")";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PipelineRendezvous, GPipeAnd1F1BRunForManyShapes) {
  for (Kind kind : {Kind::GPipe, Kind::OneFOneB}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        SCOPED_TRACE(pipeline_schedule_name(kind) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        EXPECT_NO_THROW(check_rendezvous(make_pipeline_schedule(kind, p, m)));
      }
    }
  }
}

// Micro-batch counts the interleaved schedule takes (multiples of the stages), beyond the
// stages too: neighbours exchange with both sides in one batch each step, in lockstep.
TEST(PipelineRendezvous, InterleavedRunsForManyShapes) {
  int shapes = 0;
  for (int p = 2; p <= 6; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = 1; m <= std::max(12, 4 * p); ++m) {
        if (m % p != 0) continue;  // make_pipeline_schedule refuses these (pipeline_schedule_test.cpp)
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        EXPECT_NO_THROW(check_rendezvous(make_pipeline_schedule(Kind::Interleaved, p, m, v)));
        ++shapes;
      }
    }
  }
  EXPECT_GT(shapes, 60);
}

// Each rank sends in a batch of its own, then receives in the next: both sends wait for a recv
// the other rank posts only after its send has completed (with buffered sends this runs).
TEST(PipelineRendezvous, RejectsSendsThatWaitForEachOther) {
  using Op = PipelineOp;
  PipelineSchedule s = make_pipeline_schedule(Kind::GPipe, 2, 1);
  s.ranks[0] = {{Op::Forward}, {Op::SendForward}, {Op::Backward}, {Op::RecvBackward}, {Op::ReduceGradients}};
  s.ranks[1] = {{Op::SendBackward}, {Op::Forward}, {Op::RecvForward}, {Op::Backward}, {Op::ReduceGradients}};
  expect_rejected(s, "deadlocks where a send waits for its recv");
  expect_rejected(s, "rank 0 instruction 1 (send_forward micro-batch 0 chunk 0) waits for rank 1 instruction 2");
}

// Interleaved with more micro-batches than stages, each pass's messages in the batches around it
// (recv, pass, send): the lists the interleaved schedule had before its steps exchanged with
// both neighbours in one batch deadlock here.
TEST(PipelineRendezvous, RejectsInterleavedPassesWithTheirOwnBatches) {
  const PipelineSchedule s = make_pipeline_schedule(Kind::Interleaved, 2, 4, 2);
  PipelineSchedule old = s;
  for (int r = 0; r < s.stages; ++r) {
    std::vector<PipelineInstruction> passes, list;
    for (const PipelineInstruction& in : s.ranks[r]) {
      if (in.op == PipelineOp::Forward || in.op == PipelineOp::Backward) passes.push_back(in);
    }
    for (const PipelineInstruction& in : passes) {
      const bool forward = in.op == PipelineOp::Forward;
      const bool first = s.first_stage(r, in.chunk), last = s.last_stage(r, in.chunk);
      if (forward ? !first : !last) list.push_back({forward ? PipelineOp::RecvForward : PipelineOp::RecvBackward, in.micro_batch, in.chunk});
      list.push_back(in);
      if (forward ? !last : !first) list.push_back({forward ? PipelineOp::SendForward : PipelineOp::SendBackward, in.micro_batch, in.chunk});
    }
    list.push_back({PipelineOp::ReduceGradients, 0, 0});
    old.ranks[r] = list;
  }
  expect_rejected(old, "deadlocks where a send waits for its recv");
}

// Two messages between the same two ranks swapped on the sender: without tags the receiver's
// first recv would take the second message.
TEST(PipelineRendezvous, RejectsMessagesThatPairWrongly) {
  PipelineSchedule s = make_pipeline_schedule(Kind::GPipe, 2, 2);
  auto& list = s.ranks[0];
  auto a = std::find(list.begin(), list.end(), PipelineInstruction{PipelineOp::SendForward, 0, 0});
  auto b = std::find(list.begin(), list.end(), PipelineInstruction{PipelineOp::SendForward, 1, 0});
  std::iter_swap(a, b);
  expect_rejected(s, "messages pair in issue order, and rank 0");
}

}  // namespace
}  // namespace loom::parallel
