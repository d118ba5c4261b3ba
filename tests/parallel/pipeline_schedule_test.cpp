// Pipeline schedules: every instruction list of many (p, m, v) is deadlock-free and runs each
// chunk's forward before its backward (the checker), the bubble and the activation peak match
// the theory, the checker rejects broken lists, and stage partitioning.
#include <gtest/gtest.h>

#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/pipeline/pipeline_partition.h"
#include "loom/parallel/pipeline/pipeline_schedule.h"
#include "loom/parallel/pipeline/pipeline_simulation.h"

namespace loom::parallel {
namespace {

using Kind = PipelineScheduleKind;

TEST(PipelineSchedule, GPipeAnd1F1BAreValidForManyShapes) {
  for (Kind kind : {Kind::GPipe, Kind::OneFOneB}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 12; ++m) {
        SCOPED_TRACE(pipeline_schedule_name(kind) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        const PipelineSchedule s = make_pipeline_schedule(kind, p, m);
        const PipelineSimulation sim = simulate_pipeline(s);
        // Both idle (p - 1)(f + b) per rank against m (f + b) of work.
        EXPECT_NEAR(sim.bubble_fraction(), static_cast<double>(p - 1) / m, 1e-12);
        for (int r = 0; r < p; ++r) {
          // GPipe holds every micro-batch; 1F1B at most p - r on rank r.
          EXPECT_EQ(sim.peak_in_flight[r], kind == Kind::GPipe ? m : std::min(p - r, m)) << "rank " << r;
        }
      }
    }
  }
}

TEST(PipelineSchedule, InterleavedIsValidAndShrinksTheBubble) {
  for (int p = 2; p <= 6; ++p) {
    for (int v = 1; v <= 4; ++v) {
      for (int m = p; m <= 4 * p; m += p) {
        SCOPED_TRACE("p=" + std::to_string(p) + " v=" + std::to_string(v) + " m=" + std::to_string(m));
        const PipelineSchedule s = make_pipeline_schedule(Kind::Interleaved, p, m, v);
        const PipelineSimulation sim = simulate_pipeline(s);
        const double one_f_one_b = static_cast<double>(p - 1) / m;
        // Megatron's analysis: (p - 1) / (v m) with forward and backward of equal cost; with
        // backward twice forward the warm-up's forwards stay, so it lands between the two.
        EXPECT_LE(sim.bubble_fraction(), one_f_one_b + 1e-12);
        if (v > 1 && m > p) {
          EXPECT_LT(sim.bubble_fraction(), one_f_one_b);
        }
        const PipelineSimulation equal = simulate_pipeline(s, {1.0, 1.0});
        EXPECT_NEAR(equal.bubble_fraction(), static_cast<double>(p - 1) / (v * m), 1e-9);
      }
    }
  }
}

TEST(PipelineSchedule, EveryForwardPrecedesItsBackwardOnEveryStage) {
  const PipelineSchedule s = make_pipeline_schedule(Kind::Interleaved, 4, 8, 2);
  for (const auto& list : s.ranks) {
    for (size_t i = 0; i < list.size(); ++i) {
      if (list[i].op != PipelineOp::Backward) continue;
      auto forward = std::find(list.begin(), list.end(),
                               PipelineInstruction{PipelineOp::Forward, list[i].micro_batch, list[i].chunk});
      ASSERT_NE(forward, list.end());
      EXPECT_LT(forward - list.begin(), static_cast<long>(i));
    }
  }
}

TEST(PipelineSchedule, CheckerRejectsBrokenLists) {
  auto expect_rejected = [](PipelineSchedule s, const std::string& needle) {
    try {
      simulate_pipeline(s);
      ADD_FAILURE() << "accepted a broken schedule (" << needle << ")";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  PipelineSchedule s = make_pipeline_schedule(Kind::OneFOneB, 3, 4);
  // A send that never happens: the next stage waits forever.
  PipelineSchedule lost = s;
  auto& list0 = lost.ranks[0];
  list0.erase(std::find(list0.begin(), list0.end(), PipelineInstruction{PipelineOp::SendForward, 2, 0}));
  lost.ranks[0] = list0;
  expect_rejected(lost, "send_forward is missing");
  // Backward before forward on the last stage.
  PipelineSchedule swapped = s;
  auto& last = swapped.ranks[2];
  auto f = std::find(last.begin(), last.end(), PipelineInstruction{PipelineOp::Forward, 1, 0});
  auto b = std::find(last.begin(), last.end(), PipelineInstruction{PipelineOp::Backward, 1, 0});
  std::iter_swap(f, b);
  expect_rejected(swapped, "before its forward");
  // Two ranks each waiting for the other: rank 1 receives the gradient of micro-batch 0 before
  // the activations it needs to produce it.
  PipelineSchedule cycle = make_pipeline_schedule(Kind::GPipe, 2, 1);
  auto& first = cycle.ranks[0];
  // rank 0: wait for the gradient before sending the activation.
  std::swap(first[1], first[2]);  // [forward, recv_backward, send_forward, backward, ...]
  expect_rejected(cycle, "deadlocks");
}

TEST(PipelineSchedule, ShapesThatCannotRunAreClearErrors) {
  EXPECT_THROW(make_pipeline_schedule(Kind::Interleaved, 4, 6, 2), Error);  // m not a multiple of p
  EXPECT_THROW(make_pipeline_schedule(Kind::OneFOneB, 4, 8, 2), Error);     // v > 1 without interleaving
  EXPECT_THROW(make_pipeline_schedule(Kind::Interleaved, 1, 4, 2), Error);
  EXPECT_THROW(parse_pipeline_schedule("zigzag"), Error);
  try {
    make_pipeline_schedule(Kind::Interleaved, 4, 6, 2);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of the stages"), std::string::npos) << e.what();
  }
}

TEST(PipelineSchedule, TimelineShowsTheBubble) {
  const PipelineSchedule s = make_pipeline_schedule(Kind::OneFOneB, 4, 8);
  const std::string text = render_pipeline_timeline(s, simulate_pipeline(s));
  EXPECT_NE(text.find("stage 3 |"), std::string::npos) << text;
  EXPECT_NE(text.find("F7"), std::string::npos) << text;
  EXPECT_NE(text.find("theory (p - 1) / (v m) = 0.3750"), std::string::npos) << text;
}

TEST(PipelinePartition, EvenBalancedAndExplicit) {
  const std::vector<double> uniform(8, 1.0);
  EXPECT_EQ(partition_layers("even", uniform, 0.0, 4), (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_layers("even", std::vector<double>(7, 1.0), 0.0, 2), (std::vector<int>{0, 3, 7}));
  // One expensive layer (attention + MLP among MLP-only layers) and a costly head.
  const std::vector<double> mixed{1, 1, 1, 6, 1, 1};
  EXPECT_EQ(partition_layers("balanced", mixed, 0.0, 3), (std::vector<int>{0, 3, 4, 6}));
  EXPECT_EQ(partition_layers("balanced", uniform, 3.0, 2), (std::vector<int>{0, 5, 8}));
  EXPECT_EQ(partition_layers("3,1,2", mixed, 0.0, 3), (std::vector<int>{0, 3, 4, 6}));
  EXPECT_THROW(partition_layers("3,1,1", mixed, 0.0, 3), Error);   // 5 of 6 layers
  EXPECT_THROW(partition_layers("3,x,2", mixed, 0.0, 3), Error);
  EXPECT_THROW(partition_layers("3,0,3", mixed, 0.0, 3), Error);
  EXPECT_THROW(partition_layers("even", mixed, 0.0, 7), Error);    // more stages than layers
}

}  // namespace
}  // namespace loom::parallel
