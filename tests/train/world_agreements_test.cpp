// The trainer's agreements: the global token count is summed exactly (also beyond f32's 2^24),
// and the loss/stop agreement sums the contributing ranks and ORs the stop requests.
#include <gtest/gtest.h>

#include <csignal>
#include <mutex>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/train/world_agreements.h"

namespace loom::train {
namespace {

TEST(WorldAgreements, TokenCountIsExactForLargeAndAwkwardCounts) {
  const std::vector<int64_t> counts = {0, 1, (int64_t{1} << 40) + 12345, 16777217, 255, 256, 65535};
  for (int ranks : {1, 2, 3, 7}) {
    comm::LaunchOptions options;
    options.ranks = ranks;
    std::mutex mutex;
    std::vector<int64_t> agreed;
    comm::launch(options, [&](comm::Communicator& world) {
      const int64_t total = agree_token_count(world, counts[static_cast<size_t>(world.rank())]);
      std::lock_guard<std::mutex> lock(mutex);
      agreed.push_back(total);
    });
    int64_t expected = 0;
    for (int r = 0; r < ranks; ++r) expected += counts[static_cast<size_t>(r)];
    ASSERT_EQ(agreed.size(), static_cast<size_t>(ranks));
    for (int64_t total : agreed) EXPECT_EQ(total, expected) << ranks << " ranks";
  }
}

TEST(WorldAgreements, LossSumsContributorsAndAnyStopStopsAll) {
  // Rank 2 got SIGINT, rank 3 SIGTERM: every rank stops, reporting SIGTERM.
  comm::LaunchOptions options;
  options.ranks = 4;
  std::mutex mutex;
  std::vector<LossAndStop> results;
  comm::launch(options, [&](comm::Communicator& world) {
    const bool contributes = world.rank() % 2 == 1;
    const LossAndStop r = agree_loss_and_stop(world, contributes, 1.5 * world.rank(),
                                               world.rank() == 2 ? SIGINT : world.rank() == 3 ? SIGTERM : 0);
    std::lock_guard<std::mutex> lock(mutex);
    results.push_back(r);
  });
  ASSERT_EQ(results.size(), 4u);
  for (const LossAndStop& r : results) {
    EXPECT_DOUBLE_EQ(r.loss_sum, 1.5 * 1 + 1.5 * 3);
    EXPECT_EQ(r.stop_signal, SIGTERM);
  }
}

// One rank out of time (train.exit_duration_mins) stops them all, below any signal; the extra
// sums still travel after the stop counts.
TEST(WorldAgreements, ARanksTimeRunningOutStopsAllBelowSignals) {
  for (const int other : {0, SIGINT, SIGTERM}) {
    comm::LaunchOptions options;
    options.ranks = 3;
    std::mutex mutex;
    std::vector<LossAndStop> results;
    comm::launch(options, [&](comm::Communicator& world) {
      const int request = world.rank() == 1 ? kStopForDuration : world.rank() == 2 ? other : 0;
      const LossAndStop r = agree_loss_and_stop(world, true, 1.0, request, {2.0, 0.25});
      std::lock_guard<std::mutex> lock(mutex);
      results.push_back(r);
    });
    ASSERT_EQ(results.size(), 3u);
    for (const LossAndStop& r : results) {
      EXPECT_EQ(r.stop_signal, other == 0 ? kStopForDuration : other) << "other rank's signal " << other;
      EXPECT_DOUBLE_EQ(r.loss_sum, 3.0);
      EXPECT_EQ(r.extra, (std::vector<double>{6.0, 0.75}));
    }
  }
}

}  // namespace
}  // namespace loom::train
