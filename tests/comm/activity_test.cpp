// comm/activity: the record of the collective each rank waits in, which heartbeats report.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "loom/comm/activity.h"
#include "loom/comm/launch.h"

namespace loom::comm {
namespace {

TEST(Activity, ScopesNestAndRecordChanges) {
  activity::enable();
  const activity::RankActivity before = activity::snapshot(41);
  {
    activity::Scope outer(41, "all_gather", "tp-0", 3);
    {
      activity::Scope inner(41, "all_reduce", "dp-1", 9);
      const activity::RankActivity now = activity::snapshot(41);
      ASSERT_EQ(now.waiting.size(), 2u);
      EXPECT_EQ(now.waiting[0].op, "all_gather");  // oldest first
      EXPECT_EQ(now.waiting[1].group, "dp-1");
      EXPECT_EQ(now.waiting[1].seq, 9);
    }
    EXPECT_EQ(activity::snapshot(41).waiting.size(), 1u);
  }
  const activity::RankActivity after = activity::snapshot(41);
  EXPECT_TRUE(after.waiting.empty());
  EXPECT_EQ(after.changes, before.changes + 4);
  EXPECT_TRUE(activity::snapshot(42).waiting.empty());  // another rank
}

// A rank that reaches an all-reduce first is recorded as waiting in it, by world rank, until
// the late rank arrives.
TEST(Activity, ThreadsBackendRecordsTheCollectiveARankWaitsIn) {
  activity::enable();
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = 2;
  std::atomic<bool> seen{false};
  launch(options, [&](Communicator& world) {
    float value = 1.0f;
    if (world.rank() == 1) {
      for (int i = 0; i < 200 && !seen.load(); ++i) {
        const activity::RankActivity zero = activity::snapshot(0);
        if (!zero.waiting.empty() && zero.waiting[0].op == "all_reduce" && zero.waiting[0].group == "world") {
          seen.store(true);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    world.all_reduce(&value, 1, DType::F32, ReduceOp::Sum);
  });
  EXPECT_TRUE(seen.load());
  EXPECT_TRUE(activity::snapshot(0).waiting.empty());
}

}  // namespace
}  // namespace loom::comm
