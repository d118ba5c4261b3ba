// DDP gradient reduction on the threads backend: every rank ends with the serial sum (or mean)
// of all ranks' gradients whatever order the parameters are marked in, unmarked parameters
// included, over several steps; and the overlap statistic is sane.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include "loom/core/error.h"
#include "loom/parallel/data/grad_buckets.h"
#include "test_helpers.h"

namespace loom::parallel {
namespace {

using testing::random_values;
using testing::ranges;
using testing::threads;
using testing::total;

const std::vector<int64_t> kSizes = {7, 13, 1, 257, 5, 31, 2, 64, 0, 11};

enum class Order { Reverse, ShuffledPerRank, SomeUnmarked };

uint64_t grad_seed(int step, int rank) { return 1000 + 17 * static_cast<uint64_t>(step) + rank; }

// Runs `steps` DDP steps on `ranks` ranks; returns the largest relative error against the serial
// reduction seen by any rank.
double run_ddp(int ranks, int64_t bucket_bytes, Order order, comm::ReduceOp op, int steps) {
  const auto params = ranges(kSizes);
  const int64_t n = total(params);
  std::mutex mutex;
  double worst = 0.0;
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    std::vector<float> grads(static_cast<size_t>(n));
    GradReducer reducer(world, grads.data(), make_buckets(params, bucket_bytes, 1), op);
    std::mt19937 rng(world.rank() + 99);
    double mine = 0.0;
    for (int step = 0; step < steps; ++step) {
      const std::vector<float> fresh = random_values(grad_seed(step, world.rank()), n);
      std::copy(fresh.begin(), fresh.end(), grads.begin());  // the reducer keeps a pointer into grads
      std::vector<int> marks;
      for (int p = static_cast<int>(params.size()) - 1; p >= 0; --p) marks.push_back(p);
      if (order == Order::ShuffledPerRank) std::shuffle(marks.begin(), marks.end(), rng);
      if (order == Order::SomeUnmarked) marks.resize(marks.size() / 2);
      for (int p : marks) reducer.mark_ready(p);
      reducer.finish();
      std::vector<std::vector<float>> all;
      for (int r = 0; r < ranks; ++r) all.push_back(random_values(grad_seed(step, r), n));
      for (int64_t i = 0; i < n; ++i) {
        double expected = 0.0;
        for (int r = 0; r < ranks; ++r) expected += all[r][i];
        if (op == comm::ReduceOp::Avg) expected /= ranks;
        mine = std::max(mine, std::abs(grads[i] - expected) / std::max(1.0, std::abs(expected)));
      }
    }
    std::lock_guard lock(mutex);
    worst = std::max(worst, mine);
  });
  return worst;
}

TEST(Ddp, SumsGradientsInReverseOrder) {
  for (int ranks : {2, 4}) {
    for (int64_t bucket_bytes : {int64_t{4}, int64_t{100}, int64_t{1} << 20}) {
      EXPECT_LE(run_ddp(ranks, bucket_bytes, Order::Reverse, comm::ReduceOp::Sum, 2), 1e-6)
          << ranks << " ranks, bucket_bytes " << bucket_bytes;
    }
  }
}

TEST(Ddp, MarkingOutOfOrderStillLaunchesInBucketOrder) {
  // Each rank marks in its own random order: buckets become ready in different orders on
  // different ranks, and only the in-order launch keeps the collectives matched.
  for (int ranks : {2, 4}) EXPECT_LE(run_ddp(ranks, 40, Order::ShuffledPerRank, comm::ReduceOp::Sum, 3), 1e-6);
}

TEST(Ddp, FinishReducesParametersNeverMarked) {
  EXPECT_LE(run_ddp(3, 60, Order::SomeUnmarked, comm::ReduceOp::Sum, 2), 1e-6);
}

TEST(Ddp, AveragesWhenAsked) { EXPECT_LE(run_ddp(4, 100, Order::Reverse, comm::ReduceOp::Avg, 1), 1e-6); }

TEST(Ddp, RejectsMisuse) {
  comm::launch(threads(1), [&](comm::Communicator& world) {
    const auto params = ranges({4, 4});
    std::vector<float> grads(8);
    EXPECT_THROW(GradReducer(world, grads.data(), make_buckets(params, 16, 1), comm::ReduceOp::Max), Error);
    GradReducer reducer(world, grads.data(), make_buckets(params, 16, 1));
    reducer.mark_ready(1);
    EXPECT_THROW(reducer.mark_ready(1), Error);
    EXPECT_THROW(reducer.mark_ready(2), Error);
    reducer.reset();
    reducer.mark_ready(1);  // a fresh round after reset
    reducer.finish();
  });
}

TEST(Ddp, OverlapStatisticSeesHiddenAndExposedCommunication) {
  const auto params = ranges({4096, 4096, 4096, 4096});
  comm::launch(threads(2), [&](comm::Communicator& world) {
    std::vector<float> grads(4 * 4096, 1.0f);
    GradReducer reducer(world, grads.data(), make_buckets(params, 4096 * 4, 1));
    // Everything marked, then "the rest of backward" (a sleep) while the buckets reduce.
    for (int p = 3; p >= 0; --p) reducer.mark_ready(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reducer.finish();
    const OverlapStats hidden = reducer.last_stats();
    EXPECT_EQ(hidden.rounds, 1);
    EXPECT_GE(hidden.window_s, 0.1);
    EXPECT_LE(hidden.blocked_s, hidden.window_s);
    EXPECT_GT(hidden.hidden_fraction(), 0.5);
    // Nothing marked: all communication happens inside finish(), none of it hidden.
    reducer.finish();
    EXPECT_LT(reducer.last_stats().hidden_fraction(), 1e-9);
    EXPECT_EQ(reducer.total_stats().rounds, 2);
    EXPECT_FLOAT_EQ(grads[0], 4.0f);  // two sums of two ranks' ones
  });
}

}  // namespace
}  // namespace loom::parallel
