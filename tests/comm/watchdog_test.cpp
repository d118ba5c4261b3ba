// The watchdog of operations nobody waits for on the host (comm/watchdog.h): a watch is dropped
// once it polls done, reported with its reason when it polls failed, and reported as timed out
// once past its timeout, each exactly once and then polled no more; the others keep being polled. And the
// stream-ordered wait of Work (wait_in_stream): every blocking form of Communicator but the
// barrier takes it, all_of passes it to each part, and a backend without a device order waits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/launch.h"
#include "loom/comm/watchdog.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;

// The failures a watchdog reported, in order.
struct Reports {
  std::mutex mutex;
  std::vector<std::string> messages;
  Watchdog::FailureHandler handler() {
    return [this](const std::string& m) {
      std::lock_guard<std::mutex> lock(mutex);
      messages.push_back(m);
    };
  }
  std::vector<std::string> taken() {
    std::lock_guard<std::mutex> lock(mutex);
    return messages;
  }
};

// Polls until `done` holds or 10 s pass.
template <typename F>
bool eventually(F done) {
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(Watchdog, DropsWhatCompletesAndReportsWhatFailsOrOutlivesItsTimeoutOnce) {
  Reports reports;
  Watchdog dog(reports.handler(), 500us);
  std::atomic<bool> finish{false};
  std::atomic<int> polls_after_done{0}, hang_polls{0};
  std::atomic<bool> done_reported{false};

  // Completes when told to; polled no more after that.
  dog.watch("completes", 3600000ms, [&]() -> Watchdog::Poll {
    if (done_reported) ++polls_after_done;
    if (!finish) return {};
    done_reported = true;
    return {Watchdog::State::Done, ""};
  });
  // Fails on its third poll.
  auto fails = std::make_shared<std::atomic<int>>(0);
  dog.watch("fails", 3600000ms, [fails]() -> Watchdog::Poll {
    if (++*fails < 3) return {};
    return {Watchdog::State::Failed, "the peer went away"};
  });
  // Never completes: reported once its 50 ms have passed.
  const auto hang_start = Watchdog::Clock::now();
  dog.watch("hangs", 50ms, [&] {
    ++hang_polls;
    return Watchdog::Poll{};
  });

  ASSERT_TRUE(eventually([&] { return reports.taken().size() == 2; })) << dog.watching() << " still watched";
  EXPECT_GE(Watchdog::Clock::now() - hang_start, 50ms);
  EXPECT_EQ(dog.watching(), 1u);  // "completes" is still pending
  const int hang_polls_when_reported = hang_polls;
  finish = true;
  ASSERT_TRUE(eventually([&] { return dog.watching() == 0; }));
  std::this_thread::sleep_for(20ms);  // rounds that would poll a dropped watch again

  const std::vector<std::string> got = reports.taken();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], "fails: the peer went away");
  EXPECT_EQ(got[1].rfind("hangs timed out after 50 ms (", 0), 0u) << got[1];
  EXPECT_EQ(*fails, 3);
  EXPECT_EQ(hang_polls, hang_polls_when_reported);  // reported, then dropped
  EXPECT_GT(hang_polls_when_reported, 1);           // polled until its timeout passed
  EXPECT_EQ(polls_after_done, 0);
  EXPECT_TRUE(done_reported);
}

// Watches added from several threads while the watchdog polls, each done after a few polls: all
// are dropped, none reported; the watchdog then sleeps until the next one, which it still serves.
TEST(Watchdog, ServesWatchesAddedWhileItPollsAndAfterItWentIdle) {
  Reports reports;
  Watchdog dog(reports.handler(), 200us);
  auto add = [&](int polls_left) {
    auto left = std::make_shared<std::atomic<int>>(polls_left);
    dog.watch("op", 3600000ms, [left]() -> Watchdog::Poll {
      if (--*left > 0) return {};
      return {Watchdog::State::Done, ""};
    });
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) add(1 + (i + t) % 5);
    });
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(eventually([&] { return dog.watching() == 0; })) << dog.watching() << " still watched";
  std::this_thread::sleep_for(10ms);
  add(2);
  ASSERT_TRUE(eventually([&] { return dog.watching() == 0; }));
  EXPECT_TRUE(reports.taken().empty());
}

// A watchdog destroyed with watches pending stops without reporting them.
TEST(Watchdog, StopsWithWatchesPendingAndReportsNone) {
  Reports reports;
  std::atomic<int> polls{0};
  {
    Watchdog dog(reports.handler(), 200us);
    dog.watch("pending", 3600000ms, [&]() -> Watchdog::Poll {
      ++polls;
      return {};
    });
    ASSERT_TRUE(eventually([&] { return polls > 2; }));
  }
  EXPECT_TRUE(reports.taken().empty());
}

// How each blocking form finished its operation.
struct Waits {
  int host = 0, in_stream = 0;
};

class RecordedWork final : public Work {
 public:
  explicit RecordedWork(Waits& waits) : waits_(waits) {}
  void wait() override { ++waits_.host; }
  bool test() override { return true; }
  void wait_in_stream() override { ++waits_.in_stream; }

 private:
  Waits& waits_;
};

// A group of one whose every operation only records how it is waited for.
class RecordingCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  std::string backend() const override { return "recording"; }
  WorkHandle all_reduce_async(void*, int64_t, DType, ReduceOp) override { return work(); }
  WorkHandle reduce_scatter_async(const void*, void*, int64_t, DType, ReduceOp) override { return work(); }
  WorkHandle all_gather_async(const void*, void*, int64_t, DType) override { return work(); }
  WorkHandle all_gather_v_async(const void*, void*, std::span<const int64_t>, DType) override { return work(); }
  WorkHandle broadcast_async(void*, int64_t, DType, int) override { return work(); }
  WorkHandle reduce_async(const void*, void*, int64_t, DType, ReduceOp, int) override { return work(); }
  WorkHandle all_to_all_async(const void*, void*, int64_t, DType) override { return work(); }
  WorkHandle all_to_all_v_async(const void*, std::span<const int64_t>, void*, std::span<const int64_t>,
                                DType) override {
    return work();
  }
  WorkHandle barrier_async() override { return work(); }
  WorkHandle send_async(const void*, int64_t, DType, int, int) override { return work(); }
  WorkHandle recv_async(void*, int64_t, DType, int, int) override { return work(); }
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }

  Waits waits;

 private:
  WorkHandle work() { return std::make_shared<RecordedWork>(waits); }
  std::string name_ = "recording";
  std::vector<int> ranks_{0};
};

TEST(WaitInStream, BlockingFormsOrderTheirResultsBeforeLaterWorkAndABarrierWaitsOnTheHost) {
  RecordingCommunicator c;
  float x = 0;
  const int64_t counts[] = {1};
  c.all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
  c.reduce_scatter(&x, &x, 1, DType::F32, ReduceOp::Sum);
  c.all_gather(&x, &x, 1, DType::F32);
  c.all_gather_v(&x, &x, counts, DType::F32);
  c.broadcast(&x, 1, DType::F32, 0);
  c.reduce(&x, &x, 1, DType::F32, ReduceOp::Sum, 0);
  c.all_to_all(&x, &x, 1, DType::F32);
  c.all_to_all_v(&x, counts, &x, counts, DType::F32);
  c.send(&x, 1, DType::F32, 0, 0);
  c.recv(&x, 1, DType::F32, 0, 0);
  EXPECT_EQ(c.waits.in_stream, 10);
  EXPECT_EQ(c.waits.host, 0);
  c.barrier();
  EXPECT_EQ(c.waits.host, 1);
  EXPECT_EQ(c.waits.in_stream, 10);

  Waits parts;
  WorkHandle both = all_of({std::make_shared<RecordedWork>(parts), std::make_shared<RecordedWork>(parts)});
  both->wait_in_stream();
  EXPECT_EQ(parts.in_stream, 2);
  EXPECT_EQ(parts.host, 0);
  both->wait();
  EXPECT_EQ(parts.host, 2);
}

// On a backend without a device order (threads) wait_in_stream is wait: the data is there when it
// returns, here a sum over 3 ranks.
TEST(WaitInStream, WaitsOnTheHostWhereTheBackendHasNoDeviceOrder) {
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = 3;
  launch(options, [](Communicator& world) {
    std::vector<float> data(1021, static_cast<float>(world.rank() + 1));
    WorkHandle w = world.all_reduce_async(data.data(), static_cast<int64_t>(data.size()), DType::F32, ReduceOp::Sum);
    w->wait_in_stream();
    for (float v : data) ASSERT_EQ(v, 6.0f);
  });
}

}  // namespace
}  // namespace loom::comm
