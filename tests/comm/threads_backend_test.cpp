// The threads backend beyond the numbers (collectives_test.cpp has those): launch, backend
// detection, split, asynchronous progress and ordering, send/recv, the link-model accounting,
// and the faults: timeouts naming the missing rank, mismatches, a failing rank.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/compute_queue.h"
#include "loom/core/device.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

LaunchOptions threads(int ranks, milliseconds timeout = std::chrono::seconds(60)) {
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = ranks;
  options.comm.timeout = timeout;
  return options;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs `f`, returns the loom::Error message it throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Waits (sleeping) until `flag` reaches `value` or 20 s pass: lets a rank stay alive and idle.
void await(const std::atomic<int>& flag, int value) {
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (flag.load() < value && Clock::now() < give_up) std::this_thread::sleep_for(milliseconds(5));
}

TEST(ThreadsBackend, LaunchGivesEveryRankItsWorld) {
  for (int ranks : {1, 2, 3, 8}) {
    std::vector<int> seen(ranks, 0);
    launch(threads(ranks), [&](Communicator& world) {
      EXPECT_EQ(world.size(), ranks);
      EXPECT_EQ(world.name(), "world");
      EXPECT_EQ(world.backend(), "threads");
      std::vector<int> all(ranks);
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(world.world_ranks(), all);
      seen[world.rank()] += 1;
    });
    EXPECT_EQ(seen, std::vector<int>(ranks, 1));
  }
}

// A device that records, for each synchronize(), the calling thread and its compute queue.
class QueueRecordingAllocator final : public Allocator {
 public:
  void* allocate(size_t) override { return nullptr; }
  void free(void*, size_t) override {}
  void zero(void*, size_t) override {}
  void copy(void*, const void*, size_t) override {}
  void to_host(void*, const void*, size_t) override {}
  void from_host(void*, const void*, size_t) override {}
  size_t alignment() const override { return 256; }
  Device device() const override { return Device::cuda(kMaxCudaDevices - 1); }
  void synchronize() override {
    std::lock_guard<std::mutex> lock(mutex);
    synchronized.emplace_back(std::this_thread::get_id(), compute_queue());
  }
  std::mutex mutex;
  std::vector<std::pair<std::thread::id, int>> synchronized;
};

// Each rank thread works on a compute queue of its own (rank + 1), so ranks sharing a GPU queue
// their work side by side, and waits for its devices' work before it ends, so the thread that
// joins the world reads what the ranks wrote; the launching thread keeps its own queue.
TEST(ThreadsBackend, EveryRankHasAComputeQueueOfItsOwnAndFinishesItsWork) {
  // Never destroyed, and only this launch's threads counted: a rank thread another test abandoned
  // may still end (and synchronize) while this one runs.
  static auto* device = new QueueRecordingAllocator();
  register_allocator(device->device(), device);
  std::vector<int> queues(3, -1);
  std::vector<std::thread::id> threads_of(3);
  launch(threads(3), [&](Communicator& world) {
    queues[static_cast<size_t>(world.rank())] = compute_queue();
    threads_of[static_cast<size_t>(world.rank())] = std::this_thread::get_id();
    world.barrier();
  });
  register_allocator(device->device(), nullptr);
  EXPECT_EQ(queues, (std::vector<int>{1, 2, 3}));
  std::vector<int> synchronized(3, 0);
  {
    std::lock_guard<std::mutex> lock(device->mutex);
    for (const auto& [thread, queue] : device->synchronized) {
      for (size_t r = 0; r < threads_of.size(); ++r) {
        if (thread == threads_of[r]) synchronized[r] = queue;
      }
    }
  }
  EXPECT_EQ(synchronized, (std::vector<int>{1, 2, 3}));  // each rank waited, on its own queue
  EXPECT_EQ(compute_queue(), 0);
}

TEST(ThreadsBackend, LaunchRejectsBadOptions) {
  auto nothing = [](Communicator&) {};
  EXPECT_HAS(error_of([&] { launch(threads(0), nothing); }), "runtime.ranks must be at least 1");
  EXPECT_HAS(error_of([&] { launch(threads(2, milliseconds(0)), nothing); }), "runtime.timeout_s must be positive");
  LaunchOptions unknown = threads(2);
  unknown.backend = "carrier-pigeon";
  EXPECT_HAS(error_of([&] { launch(unknown, nothing); }), "valid: threads, mpi, auto");
}

TEST(ThreadsBackend, DetectBackendReadsTheLauncherEnvironment) {
  const char* names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID", "SLURM_NTASKS"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : names) {
    const char* value = std::getenv(name);
    saved[name] = value ? std::optional<std::string>(value) : std::nullopt;
    unsetenv(name);
  }
  EXPECT_EQ(detect_backend(), "threads");
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"}) {
    setenv(name, "4", 1);
    EXPECT_EQ(detect_backend(), "mpi") << name;
    unsetenv(name);
  }
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  EXPECT_EQ(detect_backend(), "threads") << "a one-task srun step is not an MPI job";
  setenv("SLURM_NTASKS", "4", 1);
  EXPECT_EQ(detect_backend(), "mpi");
  for (const auto& [name, value] : saved) {
    if (value) {
      setenv(name.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name.c_str());
    }
  }
}

TEST(ThreadsBackend, SplitBuildsTheGroupsOfA2x2x2Mesh) {
  std::mutex mutex;
  std::map<std::string, std::vector<int>> members;  // group name -> world ranks, as each member sees them
  std::atomic<int> bad{0};
  launch(threads(8), [&](Communicator& world) {
    const int r = world.rank();
    auto tp = world.split(r / 2, r, "tp-" + std::to_string(r / 2));
    auto dp = world.split(r % 2 + 2 * (r / 4), r, "dp-" + std::to_string(r % 2 + 2 * (r / 4)));
    auto pp = world.split(r % 4, r, "pp-" + std::to_string(r % 4));
    auto none = world.split(r == 5 ? 0 : -1, 0, "only-5");
    // Reversed keys order the new group backwards; a split of a split works like any other.
    auto reversed = world.split(0, -r, "reversed");
    auto halves = reversed->split(reversed->rank() / 4, 0, "half-" + std::to_string(reversed->rank() / 4));
    if (tp->rank() != r % 2 || dp->rank() != (r / 2) % 2 || pp->rank() != r / 4) bad.fetch_add(1);
    if ((none != nullptr) != (r == 5) || reversed->rank() != 7 - r || halves->size() != 4) bad.fetch_add(1);
    std::lock_guard lock(mutex);
    for (Communicator* group : {tp.get(), dp.get(), pp.get(), halves.get()}) {
      auto [it, fresh] = members.try_emplace(group->name(), group->world_ranks());
      if (!fresh && it->second != group->world_ranks()) bad.fetch_add(1);
    }
  });
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(members["tp-0"], (std::vector<int>{0, 1}));
  EXPECT_EQ(members["tp-3"], (std::vector<int>{6, 7}));
  EXPECT_EQ(members["dp-0"], (std::vector<int>{0, 2}));
  EXPECT_EQ(members["dp-3"], (std::vector<int>{5, 7}));
  EXPECT_EQ(members["pp-0"], (std::vector<int>{0, 4}));
  EXPECT_EQ(members["pp-3"], (std::vector<int>{3, 7}));
  EXPECT_EQ(members["half-0"], (std::vector<int>{7, 6, 5, 4}));
  EXPECT_EQ(members["half-1"], (std::vector<int>{3, 2, 1, 0}));
}

TEST(ThreadsBackend, SplitRejectsOneGroupWithTwoNames) {
  std::atomic<int> reported{0};
  launch(threads(2), [&](Communicator& world) {
    const std::string message = error_of([&] { world.split(0, 0, world.rank() == 0 ? "tp-0" : "dp-0"); });
    if (message.find("name their new group differently") != std::string::npos &&
        message.find("'dp-0' on group rank 1") != std::string::npos) {
      reported.fetch_add(1);
    }
  });
  EXPECT_EQ(reported.load(), 2);
}

// The reduction happens while the caller does something else: it never calls wait(), only
// test(), and the operation still completes.
TEST(ThreadsBackend, AsyncAllReduceProgressesWhileTheCallerComputes) {
  const int64_t count = 1 << 20;
  std::atomic<int> completed{0};
  launch(threads(4), [&](Communicator& world) {
    std::vector<float> data(count, static_cast<float>(world.rank() + 1));
    WorkHandle work = world.all_reduce_async(data.data(), count, DType::F32, ReduceOp::Sum);
    double busy = 0;
    const auto give_up = Clock::now() + std::chrono::seconds(20);
    while (!work->test() && Clock::now() < give_up) {
      for (int i = 0; i < 10000; ++i) busy += 1e-9 * i;  // the caller's own computation
      std::this_thread::yield();
    }
    if (work->test() && data[0] == 10.0f && data[count - 1] == 10.0f && busy > 0) completed.fetch_add(1);
    work->wait();  // waiting on a finished operation (again) is fine
    work->wait();
  });
  EXPECT_EQ(completed.load(), 4);
}

TEST(ThreadsBackend, OperationsOfOneGroupCompleteInIssueOrder) {
  std::atomic<int> out_of_order{0};
  launch(threads(3), [&](Communicator& world) {
    std::vector<std::vector<float>> buffers;
    for (int i = 0; i < 12; ++i) buffers.emplace_back(i % 2 ? 100000 : 10, 1.0f);  // mixed large and small
    std::vector<WorkHandle> works;
    for (auto& b : buffers) works.push_back(world.all_reduce_async(b.data(), static_cast<int64_t>(b.size()), DType::F32, ReduceOp::Sum));
    works.back()->wait();
    for (auto& w : works) {
      if (!w->test()) out_of_order.fetch_add(1);  // everything issued earlier is done too
    }
    for (auto& b : buffers) {
      if (b.front() != 3.0f || b.back() != 3.0f) out_of_order.fetch_add(1);
    }
  });
  EXPECT_EQ(out_of_order.load(), 0);
}

// Two groups' operations are in flight at once: rank 0 leaves a world all-reduce pending while it
// runs a blocking pair all-reduce that rank 1 issues before joining the world one. Were the groups
// served one operation at a time per rank, this would deadlock.
TEST(ThreadsBackend, AsyncOperationsOnTwoGroupsOverlap) {
  std::vector<float> result(4, 0.0f);
  launch(threads(4), [&](Communicator& world) {
    const int r = world.rank();
    auto pair = world.split(r / 2, r, "pair-" + std::to_string(r / 2));
    float w = static_cast<float>(r + 1), p = static_cast<float>(10 * (r + 1));
    if (r % 2 == 0) {
      WorkHandle pending = world.all_reduce_async(&w, 1, DType::F32, ReduceOp::Sum);
      pair->all_reduce(&p, 1, DType::F32, ReduceOp::Sum);
      pending->wait();
    } else {
      pair->all_reduce(&p, 1, DType::F32, ReduceOp::Sum);
      world.all_reduce(&w, 1, DType::F32, ReduceOp::Sum);
    }
    result[r] = w * 1000 + p;
  });
  EXPECT_EQ(result, (std::vector<float>{10030, 10030, 10070, 10070}));
}

TEST(ThreadsBackend, SendRecvMatchTagsOutOfOrder) {
  std::vector<float> first(5), second(5), third(5);
  launch(threads(2), [&](Communicator& world) {
    if (world.rank() == 0) {
      std::vector<float> two(5, 2.0f), one(5, 1.0f), again(5, 22.0f);
      WorkHandle a = world.send_async(two.data(), 5, DType::F32, 1, 2);  // tag 2 first
      WorkHandle b = world.send_async(one.data(), 5, DType::F32, 1, 1);
      WorkHandle c = world.send_async(again.data(), 5, DType::F32, 1, 2);  // second message on tag 2
      c->wait();
      b->wait();
      a->wait();
    } else {
      world.recv(first.data(), 5, DType::F32, 0, 1);  // tag 1 first
      world.recv(second.data(), 5, DType::F32, 0, 2);
      world.recv(third.data(), 5, DType::F32, 0, 2);
    }
  });
  EXPECT_EQ(first, std::vector<float>(5, 1.0f));
  EXPECT_EQ(second, std::vector<float>(5, 2.0f));
  EXPECT_EQ(third, std::vector<float>(5, 22.0f)) << "messages with one tag arrive in issue order";
}

TEST(ThreadsBackend, SendCompletesOnlyWhenReceived) {
  std::atomic<int> stage{0};
  std::atomic<bool> early{false};
  float got = 0;
  launch(threads(2), [&](Communicator& world) {
    float value = 7.0f;
    if (world.rank() == 0) {
      WorkHandle send = world.send_async(&value, 1, DType::F32, 1, 0);
      std::this_thread::sleep_for(milliseconds(20));
      if (send->test()) early = true;  // rank 1 has not posted its recv yet
      stage = 1;
      send->wait();
    } else {
      await(stage, 1);
      world.recv(&got, 1, DType::F32, 0, 0);
    }
  });
  EXPECT_FALSE(early.load());
  EXPECT_EQ(got, 7.0f);
}

// Every rank sends right and receives from the left, all asynchronous, then waits: with MPI
// semantics this never deadlocks, whichever side waits first.
TEST(ThreadsBackend, RingExchangeOfAsyncSendsAndRecvs) {
  const int ranks = 8;
  const int64_t count = 1009;
  std::vector<std::vector<float>> got(ranks);
  launch(threads(ranks), [&](Communicator& world) {
    const int r = world.rank(), right = (r + 1) % ranks, left = (r + ranks - 1) % ranks;
    std::vector<float> out(count, static_cast<float>(r)), in(count, -1.0f);
    WorkHandle send = world.send_async(out.data(), count, DType::F32, right, 3);
    WorkHandle recv = world.recv_async(in.data(), count, DType::F32, left, 3);
    send->wait();
    recv->wait();
    got[r] = std::move(in);
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(got[r], std::vector<float>(count, static_cast<float>((r + ranks - 1) % ranks))) << "rank " << r;
  }
}

TEST(ThreadsBackend, SendRecvCountMismatchIsReportedToBothSides) {
  std::atomic<int> reported{0};
  launch(threads(2), [&](Communicator& world) {
    std::vector<float> data(12);
    const std::string message = error_of([&] {
      if (world.rank() == 0) {
        world.send(data.data(), 10, DType::F32, 1, 4);
      } else {
        world.recv(data.data(), 12, DType::F32, 0, 4);
      }
    });
    if (message.find("the send carries 10 f32 elements but the matching recv expects 12 f32") != std::string::npos) {
      reported.fetch_add(1);
    }
  });
  EXPECT_EQ(reported.load(), 2);
}

TEST(ThreadsBackend, RecvWithoutSendTimesOutNamingThePeer) {
  std::atomic<int> done{0};
  std::string message;
  const auto start = Clock::now();
  launch(threads(2, milliseconds(300)), [&](Communicator& world) {
    if (world.rank() == 1) {
      float x;
      message = error_of([&] { world.recv(&x, 1, DType::F32, 0, 5); });
      done = 1;
    } else {
      await(done, 1);  // alive, just never sending
    }
  });
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_HAS(message, "group 'world' (threads) recv #0 from group rank 0 (world rank 0) with tag 5");
  EXPECT_HAS(message, "timed out after 300 ms: group rank 0 (world rank 0) never posted the matching send");
}

// A rank that skips a collective (but stays alive) makes the others fail within the timeout,
// and the message names it.
TEST(ThreadsBackend, SkippedCollectiveTimesOutNamingTheMissingRank) {
  std::atomic<int> failed{0};
  std::vector<std::string> messages(4);
  const auto start = Clock::now();
  launch(threads(4, milliseconds(500)), [&](Communicator& world) {
    world.barrier();  // #0, everyone
    float x = 1;
    if (world.rank() == 2) {
      await(failed, 3);  // skips #1
      return;
    }
    messages[world.rank()] = error_of([&] { world.all_reduce(&x, 1, DType::F32, ReduceOp::Sum); });
    failed.fetch_add(1);
  });
  const double elapsed = seconds_since(start);
  EXPECT_GE(elapsed, 0.45);
  EXPECT_LT(elapsed, 5.0);
  for (int r : {0, 1, 3}) {
    SCOPED_TRACE(r);
    EXPECT_HAS(messages[r], "group 'world' (threads) all_reduce #1 on group rank " + std::to_string(r));
    EXPECT_HAS(messages[r], "timed out after 500 ms in all_reduce #1: group rank 2 (world rank 2) never arrived");
    EXPECT_HAS(messages[r], "group rank 2 last started barrier #0");
  }
}

// A rank whose communicator is gone cannot arrive any more: the others fail at once rather
// than at the timeout.
TEST(ThreadsBackend, RankThatLeftFailsTheOthersAtOnce) {
  std::vector<std::string> messages(3);
  const auto start = Clock::now();
  launch(threads(3), [&](Communicator& world) {
    if (world.rank() == 1) return;  // skips everything
    messages[world.rank()] = error_of([&] { world.barrier(); });
  });
  EXPECT_LT(seconds_since(start), 5.0) << "the timeout is 60 s";
  EXPECT_HAS(messages[0], "group rank 1 (world rank 1) left the group");
  EXPECT_HAS(messages[2], "group rank 1 (world rank 1) left the group");
}

TEST(ThreadsBackend, MismatchesAreReportedOnEveryRankWithEachView) {
  struct Case {
    std::string name;
    std::function<void(Communicator&, std::vector<float>&)> issue;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"count",
       [](Communicator& w, std::vector<float>& d) { w.all_reduce(d.data(), w.rank() == 1 ? 12 : 10, DType::F32, ReduceOp::Sum); },
       {"all_reduce #0", "the ranks disagree", "all_reduce(count=10, dtype=f32, op=sum) on group ranks [0, 2] (world ranks [0, 2])",
        "all_reduce(count=12, dtype=f32, op=sum) on group rank 1 (world rank 1)"}},
      {"dtype",
       [](Communicator& w, std::vector<float>& d) {
         w.all_gather(d.data(), d.data() + 8, 2, w.rank() == 2 ? DType::BF16 : DType::F32);
       },
       {"all_gather(send_count=2, dtype=bf16) on group rank 2", "all_gather(send_count=2, dtype=f32) on group ranks [0, 1]"}},
      {"kind and root",
       [](Communicator& w, std::vector<float>& d) {
         if (w.rank() == 0) {
           w.all_reduce(d.data(), 4, DType::F32, ReduceOp::Sum);
         } else {
           w.broadcast(d.data(), 4, DType::F32, w.rank());
         }
       },
       {"broadcast(count=4, dtype=f32, root=1) on group rank 1", "broadcast(count=4, dtype=f32, root=2) on group rank 2",
        "all_reduce(count=4, dtype=f32, op=sum) on group rank 0"}},
      {"all_to_all_v counts",
       [](Communicator& w, std::vector<float>& d) {
         std::vector<int64_t> send(3, 1), recv(3, 1);
         if (w.rank() == 2) recv[0] = 2;
         w.all_to_all_v(d.data(), send, d.data() + 10, recv, DType::F32);
       },
       {"all_to_all_v counts disagree", "group rank 2 (world rank 2) expects 2 elements from group rank 0, which sends it 1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> messages(3), after(3);
    launch(threads(3), [&](Communicator& world) {
      std::vector<float> data(32, 1.0f);
      messages[world.rank()] = error_of([&] { c.issue(world, data); });
      // The group is unusable afterwards: the next operation fails at once, saying why.
      after[world.rank()] = error_of([&] { world.barrier(); });
    });
    for (int r = 0; r < 3; ++r) {
      for (const std::string& part : c.expected) EXPECT_HAS(messages[r], part);
      EXPECT_HAS(after[r], "barrier #1");
      EXPECT_HAS(after[r], "the group failed earlier");
    }
  }
}

struct Boom : std::exception {
  const char* what() const noexcept override { return "boom on rank 3"; }
};

// An exception in one rank's body is rethrown by launch; the others, blocked in a barrier and in
// a recv from the failing rank, fail promptly instead of hanging.
TEST(ThreadsBackend, ExceptionInOneRankIsRethrownAndTheOthersDoNotHang) {
  std::vector<std::string> messages(4);
  const auto start = Clock::now();
  bool caught = false;
  try {
    launch(threads(4), [&](Communicator& world) {
      const int r = world.rank();
      if (r == 3) {
        std::this_thread::sleep_for(milliseconds(50));
        throw Boom();
      }
      if (r == 0) {
        float x;
        messages[r] = error_of([&] { world.recv(&x, 1, DType::F32, 3, 0); });
      } else {
        messages[r] = error_of([&] { world.barrier(); });
      }
      throw Error(messages[r]);
    });
  } catch (const Boom&) {
    caught = true;
  }
  EXPECT_TRUE(caught) << "launch must rethrow the first failure with its own type";
  EXPECT_LT(seconds_since(start), 5.0) << "the timeout is 60 s";
  for (int r : {0, 1, 2}) EXPECT_HAS(messages[r], "aborted because world rank 3 failed: boom on rank 3");
}

// The link model sees every inter-rank copy, from the thread that copies, with faithful bytes.
class CountingLinks : public LinkModel {
 public:
  void transfer(int source, int destination, int64_t bytes) override {
    std::lock_guard lock(mutex_);
    bytes_[{source, destination}] += bytes;
  }
  std::map<std::pair<int, int>, int64_t> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(bytes_, {});
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, int>, int64_t> bytes_;
};

TEST(ThreadsBackend, LinkModelCountsWhatTheAlgorithmsMove) {
  const int n = 4;
  auto links = std::make_shared<CountingLinks>();
  LaunchOptions options = threads(n);
  options.link_model = links;
  std::map<std::string, std::map<std::pair<int, int>, int64_t>> seen;
  auto run = [&](const std::string& name, const std::function<void(Communicator&)>& body) {
    launch(options, body);
    seen[name] = links->take();
  };
  const int64_t large = 1 << 18, small = 1000;  // f32 elements: 1 MiB (in place), 4000 B (staged)
  run("large all_reduce", [&](Communicator& w) {
    std::vector<float> d(large, 1.0f);
    w.all_reduce(d.data(), large, DType::F32, ReduceOp::Sum);
  });
  run("small all_reduce", [&](Communicator& w) {
    std::vector<float> d(small, 1.0f);
    w.all_reduce(d.data(), small, DType::F32, ReduceOp::Sum);
  });
  run("broadcast", [&](Communicator& w) {
    std::vector<float> d(large, 1.0f);
    w.broadcast(d.data(), large, DType::F32, 2);
  });
  run("all_gather", [&](Communicator& w) {
    std::vector<float> d(small * n, 1.0f);
    w.all_gather(d.data() + w.rank() * small, d.data(), small, DType::F32);
  });
  run("send", [&](Communicator& w) {
    std::vector<float> d(small, 1.0f);
    if (w.rank() == 1) w.send(d.data(), small, DType::F32, 3, 0);
    if (w.rank() == 3) w.recv(d.data(), small, DType::F32, 1, 0);
  });
  for (int q = 0; q < n; ++q) {
    for (int r = 0; r < n; ++r) {
      SCOPED_TRACE(std::to_string(q) + " -> " + std::to_string(r));
      const std::pair<int, int> link{q, r};
      if (q == r) {  // never reported
        for (auto& [name, bytes] : seen) EXPECT_EQ(bytes.count(link), 0u) << name;
        continue;
      }
      // Reduce-scatter reads r's slice from q, all-gather q's slice: 2 * large / n elements.
      EXPECT_EQ(seen["large all_reduce"][link], 2 * large / n * 4);
      EXPECT_EQ(seen["small all_reduce"][link], small * 4);  // every rank reads everything
      EXPECT_EQ(seen["broadcast"][link], q == 2 ? large * 4 : 0);
      EXPECT_EQ(seen["all_gather"][link], small * 4);
      EXPECT_EQ(seen["send"][link], q == 1 && r == 3 ? small * 4 : 0);
    }
  }
  int64_t total = 0;
  for (auto& [link, bytes] : seen["large all_reduce"]) total += bytes;
  EXPECT_EQ(total, 2 * (n - 1) * large * 4) << "each rank moves 2 (n-1)/n of the buffer, like a ring";
}

}  // namespace
}  // namespace loom::comm
