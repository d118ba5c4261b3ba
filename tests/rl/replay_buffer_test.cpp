// The staleness rule: a learner never takes a group older than max_staleness versions, waits
// for a slow producer, does not wait for a fast one; eviction and reservation.
#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/rl/replay_buffer.h"

namespace loom::rl {
namespace {

RolloutGroup group_of(int64_t version, int64_t index = 0) {
  RolloutGroup g;
  g.weight_version = version;
  g.prompt_index = index;
  g.samples.resize(2);
  return g;
}

// A producer that generates with the weights of `version` (refit by the learner after each
// step), one group every `delay`, through reservations as the controller's rollout workers do.
struct Producer {
  Producer(ReplayBuffer& target, std::chrono::milliseconds delay) : buffer(target) {
    thread = std::thread([this, delay] {
      int64_t index = 0;
      while (!stop) {
        const int64_t v = version.load();
        if (!buffer.try_reserve(v)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          continue;
        }
        std::this_thread::sleep_for(delay);
        buffer.push(group_of(v, index++));
      }
    });
  }
  ~Producer() {
    stop = true;
    thread.join();
  }
  ReplayBuffer& buffer;
  std::atomic<int64_t> version{0};
  std::atomic<bool> stop{false};
  std::thread thread;
};

void run_learner(ReplayBuffer& buffer, Producer& producer, int64_t k, int64_t per_step, int steps,
                 std::chrono::milliseconds train_time, std::vector<TakenBatch>& batches) {
  for (int64_t step = 0; step < steps; ++step) {
    TakenBatch batch = buffer.take(step, per_step, 30.0);
    ASSERT_EQ(static_cast<int64_t>(batch.groups.size()), per_step);
    for (const RolloutGroup& g : batch.groups) {
      EXPECT_GE(g.weight_version, step - k) << "step " << step << " took a group of version " << g.weight_version;
      EXPECT_LE(g.weight_version, step);
    }
    std::this_thread::sleep_for(train_time);
    producer.version = step + 1;  // the refit
    batches.push_back(std::move(batch));
  }
}

TEST(ReplayBuffer, SlowProducerMakesTheLearnerWaitNeverTrainOnStaleData) {
  for (int64_t k : {0, 1, 2}) {
    ReplayBuffer buffer(k, 3);
    Producer producer(buffer, std::chrono::milliseconds(20));
    std::vector<TakenBatch> batches;
    run_learner(buffer, producer, k, 3, 6, std::chrono::milliseconds(1), batches);
    int waited = 0;
    for (const TakenBatch& b : batches) waited += b.blocked ? 1 : 0;
    EXPECT_GE(waited, 5) << "k " << k << ": a producer far slower than the learner must make it wait";
    buffer.close();
  }
}

TEST(ReplayBuffer, FastProducerNeverMakesTheLearnerWait) {
  ReplayBuffer buffer(1, 4);
  Producer producer(buffer, std::chrono::milliseconds(0));
  std::vector<TakenBatch> batches;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the first batch is generated
  run_learner(buffer, producer, 1, 4, 6, std::chrono::milliseconds(200), batches);
  for (const TakenBatch& b : batches) EXPECT_FALSE(b.blocked) << "step " << b.step << " waited " << b.waited_s << " s";
  // Asynchronous: steps after the first trained on groups one version old.
  int64_t one_old = 0;
  for (const TakenBatch& b : batches) one_old += b.staleness.count(1) ? b.staleness.at(1) : 0;
  EXPECT_GT(one_old, 0);
  buffer.close();
}

TEST(ReplayBuffer, SynchronousTakesOnlyTheCurrentVersion) {
  ReplayBuffer buffer(0, 2);
  EXPECT_TRUE(buffer.try_reserve(0));
  EXPECT_TRUE(buffer.try_reserve(0));
  EXPECT_FALSE(buffer.try_reserve(0)) << "version 0 serves step 0 only: prompts_per_step groups";
  buffer.push(group_of(0));
  buffer.push(group_of(0));
  const TakenBatch first = buffer.take(0, 2, 1.0);
  EXPECT_EQ(first.staleness.at(0), 2);
  EXPECT_FALSE(buffer.try_reserve(0)) << "version 0 can no longer be consumed by step 1";
  EXPECT_TRUE(buffer.try_reserve(1));
  buffer.release();
}

// A group of version v serves steps next .. v + k: no more than prompts_per_step groups per
// such step are generated, so a fast producer does not make groups that go stale unused.
TEST(ReplayBuffer, ReservationsNeverOutrunTheStalenessBound) {
  ReplayBuffer buffer(1, 2);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(buffer.try_reserve(0)) << i;  // steps 0 and 1
  EXPECT_FALSE(buffer.try_reserve(0));
  for (int i = 0; i < 4; ++i) buffer.push(group_of(0));
  buffer.take(0, 2, 1.0);
  EXPECT_FALSE(buffer.try_reserve(0)) << "step 1's groups are there; version 0 cannot serve step 2";
  EXPECT_TRUE(buffer.try_reserve(1)) << "version 1 serves steps 1 and 2: 4 slots, 2 taken by step 1's groups";
  EXPECT_TRUE(buffer.try_reserve(1));
  EXPECT_FALSE(buffer.try_reserve(1));
  buffer.release();
  buffer.release();
}

TEST(ReplayBuffer, EvictsGroupsOlderThanTheBoundAndCountsThem) {
  ReplayBuffer buffer(1, 8);
  for (int64_t v : {0, 0, 1, 2, 3, 2}) buffer.push(group_of(v));
  const TakenBatch batch = buffer.take(3, 3, 1.0);
  EXPECT_EQ(batch.evicted, 3);  // versions 0, 0, 1 < 3 - 1
  EXPECT_EQ(buffer.evicted_total(), 3);
  ASSERT_EQ(batch.groups.size(), 3u);
  EXPECT_EQ(batch.groups[0].weight_version, 2);  // oldest eligible first
  EXPECT_EQ(batch.groups[1].weight_version, 2);
  EXPECT_EQ(batch.groups[2].weight_version, 3);
  EXPECT_EQ(batch.staleness.at(1), 2);
  EXPECT_EQ(batch.staleness.at(0), 1);
  EXPECT_EQ(buffer.stored(), 0);
}

TEST(ReplayBuffer, TimeoutAndCloseAreErrorsNamingTheStep) {
  ReplayBuffer buffer(1, 2);
  buffer.push(group_of(0));
  try {
    buffer.take(4, 1, 0.05);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(">= 3"), std::string::npos) << e.what();
  }
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    buffer.close();
  });
  EXPECT_THROW(buffer.take(5, 1, 10.0), Error);
  closer.join();
  EXPECT_FALSE(buffer.try_reserve(5));
}

TEST(ReplayBuffer, RefusesInvalidSettings) {
  EXPECT_THROW(ReplayBuffer(-1, 2), Error);
  EXPECT_THROW(ReplayBuffer(1, 0), Error);
}

}  // namespace
}  // namespace loom::rl
