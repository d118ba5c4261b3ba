// Faults: a rank that skips a collective makes the others fail within the timeout naming it;
// ranks that disagree on an operation get an Error naming each rank's view. Every fault runs on
// a group split off the world for the purpose, so that the world stays healthy for what follows.
#include <chrono>
#include <climits>
#include <thread>

#include "loom/comm/mpi/backend.h"
#include "mpi_test_util.h"

namespace loom::mpi_test {
namespace {

using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

class Faults : public MpiTest {
 protected:
  // A fresh group over the whole world with a short timeout.
  std::unique_ptr<comm::Communicator> fault_group(std::chrono::milliseconds timeout, bool check_agreement = true,
                                                  bool shared_memory_counters = true) {
    comm::MpiOptions parent = comm::mpi_options(world());
    comm::MpiOptions options = parent;
    options.shared_memory_counters = shared_memory_counters;
    comm::set_mpi_options(world(), options);
    std::unique_ptr<comm::Communicator> group = world().split(0, world().rank(), "fault");
    comm::set_mpi_options(world(), parent);
    options.comm.timeout = timeout;
    options.check_agreement = check_agreement;
    comm::set_mpi_options(*group, options);
    return group;
  }

  // Runs `body` expecting a loom::Error; returns its message ("" and a test failure if none).
  template <typename F>
  std::string error_of(F&& body) {
    try {
      body();
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no loom::Error was thrown";
    return "";
  }

  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }
};

const auto kShort = std::chrono::milliseconds(1000);

// The last rank skips the group's first all-reduce; everyone else times out naming it.
TEST_F(Faults, SkippedCollectiveTimesOutNamingTheMissingRank) {
  const int n = world().size();
  const int missing = n - 1;
  std::unique_ptr<comm::Communicator> group = fault_group(kShort);
  std::vector<float> data(1000, 1.0f);
  if (world().rank() != missing) {
    const auto start = Clock::now();
    const std::string message = error_of([&] { group->all_reduce(data.data(), 1000, DType::F32, ReduceOp::Sum); });
    const double elapsed = seconds_since(start);
    EXPECT_GE(elapsed, 0.9);
    EXPECT_LT(elapsed, 10.0);
    EXPECT_NE(message.find("mpi group 'fault'"), std::string::npos) << message;
    EXPECT_NE(message.find("all_reduce #1"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out after"), std::string::npos) << message;
    EXPECT_NE(message.find("ranks that never arrived at #1: " + std::to_string(missing) + " (world rank " +
                           std::to_string(missing) + ", last entered #0)"),
              std::string::npos)
        << message;
    // Only the missing rank is named.
    EXPECT_EQ(message.find("last entered #1"), std::string::npos) << message;
    // The group is unusable from then on, and says why at once.
    const auto again = Clock::now();
    const std::string next = error_of([&] { group->barrier(); });
    EXPECT_LT(seconds_since(again), 0.5);
    EXPECT_NE(next.find("unusable since all_reduce #1"), std::string::npos) << next;
  }
  // The world is unaffected.
  world().barrier();
  float one = 1.0f;
  world().all_reduce(&one, 1, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(one, static_cast<float>(n));
}

// The same, with the operation issued async and run by the group's communication thread while
// the waiter sits in wait().
TEST_F(Faults, SkippedAsyncCollectiveTimesOutInWait) {
  const int n = world().size();
  const int missing = 0;
  std::unique_ptr<comm::Communicator> group = fault_group(kShort);
  const int64_t count = 4096 / n;
  std::vector<uint16_t> mine(static_cast<size_t>(count), 0);
  std::vector<uint16_t> gathered(static_cast<size_t>(count * n), 0);
  // One collective everyone joins first, so that the missing rank's counter stops at #1.
  float x = 1.0f;
  group->all_reduce(&x, 1, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(x, static_cast<float>(n));
  if (world().rank() != missing) {
    comm::WorkHandle handle = group->all_gather_async(mine.data(), gathered.data(), count, DType::BF16);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto start = Clock::now();
    const std::string message = error_of([&] { handle->wait(); });
    EXPECT_LT(seconds_since(start), 10.0);
    EXPECT_NE(message.find("all_gather #2"), std::string::npos) << message;
    EXPECT_NE(message.find("ranks that never arrived at #2: 0 (world rank 0, last entered #1)"), std::string::npos)
        << message;
    // A second wait reports the same failure.
    EXPECT_EQ(error_of([&] { handle->wait(); }), message);
  }
  world().barrier();
}

// Without the agreement handshake the transfer itself is what waits; the timeout still names the
// missing rank, and once that rank runs the collective too, everything drains.
TEST_F(Faults, SkippedCollectiveWithoutChecksNamesTheMissingRankAndDrains) {
  const int n = world().size();
  const int missing = n / 2;
  // Declared before the group: the others' abandoned transfer writes it until the group is gone.
  std::vector<float> data(1000, 1.0f);
  std::unique_ptr<comm::Communicator> group = fault_group(kShort, /*check_agreement=*/false);
  if (world().rank() != missing) {
    const std::string message = error_of([&] { group->all_reduce(data.data(), 1000, DType::F32, ReduceOp::Sum); });
    EXPECT_NE(message.find("ranks that never arrived at #1: " + std::to_string(missing) + " (world rank " +
                           std::to_string(missing) + ", last entered #0)"),
              std::string::npos)
        << message;
  }
  world().barrier();
  if (world().rank() == missing) {
    // Late, but it comes: the others' communication threads finish the transfer they were in.
    group->all_reduce(data.data(), 1000, DType::F32, ReduceOp::Sum);
    EXPECT_EQ(data[0], static_cast<float>(n));
  }
  world().barrier();
}

// Arrival counters read with MPI_Rget from an RMA window (what groups spanning several nodes
// use), while the missing rank is busy outside MPI.
TEST_F(Faults, ArrivalCountersInAnRmaWindow) {
  const int n = world().size();
  const int missing = 1 % n;
  std::unique_ptr<comm::Communicator> group = fault_group(kShort, true, /*shared_memory_counters=*/false);
  EXPECT_EQ(comm::mpi_arrival_counters(*group), "rma window");
  std::vector<float> data(10, 1.0f);
  if (world().rank() == missing) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // computing, not in MPI
  } else {
    const std::string message = error_of([&] { group->all_reduce(data.data(), 10, DType::F32, ReduceOp::Sum); });
    EXPECT_NE(message.find("ranks that never arrived at #1: " + std::to_string(missing) + " (world rank " +
                           std::to_string(missing) + ", last entered #0)"),
              std::string::npos)
        << message;
  }
  world().barrier();
}

TEST_F(Faults, MismatchedSizesAreReportedOnEveryRank) {
  const int rank = world().rank();
  std::unique_ptr<comm::Communicator> group = fault_group(std::chrono::seconds(60));
  const int64_t count = rank == 1 % world().size() ? 101 : 100;
  std::vector<float> data(101, 1.0f);
  const std::string message = error_of([&] { group->all_reduce(data.data(), count, DType::F32, ReduceOp::Sum); });
  EXPECT_NE(message.find("all_reduce #1"), std::string::npos) << message;
  EXPECT_NE(message.find("the ranks disagree on the operation"), std::string::npos) << message;
  if (world().size() > 1) {
    EXPECT_NE(message.find(": all_reduce (f32 x 100, sum)"), std::string::npos) << message;
    EXPECT_NE(message.find("rank 1: all_reduce (f32 x 101, sum)"), std::string::npos) << message;
  }
  // Nothing moved, and the group is still usable.
  EXPECT_EQ(data[0], 1.0f);
  group->all_reduce(data.data(), 100, DType::F32, ReduceOp::Sum);
  EXPECT_EQ(data[0], static_cast<float>(world().size()));
}

TEST_F(Faults, MismatchedDtypeOperationAndRootAreReported) {
  const int n = world().size();
  const int rank = world().rank();
  if (n < 2) GTEST_SKIP() << "a missing rank needs at least 2 ranks";
  std::unique_ptr<comm::Communicator> group = fault_group(std::chrono::seconds(60));
  std::vector<float> data(64, 1.0f);

  std::string message = error_of(
      [&] { group->all_reduce(data.data(), 64, rank == 0 ? DType::BF16 : DType::F32, ReduceOp::Sum); });
  EXPECT_NE(message.find("rank 0: all_reduce (bf16 x 64, sum)"), std::string::npos) << message;

  message = error_of([&] {
    if (rank == n - 1) {
      group->broadcast(data.data(), 64, DType::F32, 0);
    } else {
      group->all_reduce(data.data(), 64, DType::F32, ReduceOp::Max);
    }
  });
  EXPECT_NE(message.find("rank " + std::to_string(n - 1) + ": broadcast (f32 x 64, root 0)"), std::string::npos)
      << message;

  message = error_of([&] { group->broadcast(data.data(), 64, DType::F32, rank == 0 ? 1 : 0); });
  EXPECT_NE(message.find("rank 0: broadcast (f32 x 64, root 1)"), std::string::npos) << message;

  // One rank's invalid argument fails the operation everywhere.
  message = error_of([&] { group->reduce(data.data(), data.data(), 64, DType::F32, ReduceOp::Sum, rank == 0 ? n : 0); });
  EXPECT_NE(message.find("invalid arguments"), std::string::npos) << message;
  if (rank == 0) {
    EXPECT_NE(message.find("This rank: root " + std::to_string(n) + " is not a rank"), std::string::npos) << message;
  }

  // Uneven gathers must agree on the counts; all-to-all-v senders and receivers on each pair.
  std::vector<int64_t> counts(static_cast<size_t>(n), 2);
  if (rank == 0) counts[1] = 3;
  std::vector<float> gathered(static_cast<size_t>(3 * n), 0.0f);
  message = error_of([&] { group->all_gather_v(data.data(), gathered.data(), counts, DType::F32); });
  EXPECT_NE(message.find("counts hash"), std::string::npos) << message;

  std::vector<int64_t> send_counts(static_cast<size_t>(n), 1);
  std::vector<int64_t> recv_counts(static_cast<size_t>(n), 1);
  if (rank == 1) recv_counts[0] = 2;
  message = error_of([&] { group->all_to_all_v(data.data(), send_counts, gathered.data(), recv_counts, DType::F32); });
  EXPECT_NE(message.find("rank 1 expects 2 elements from rank 0, which sends it 1"), std::string::npos) << message;

  // Still usable.
  group->all_reduce(data.data(), 64, DType::F32, ReduceOp::Max);
  EXPECT_EQ(data[0], 1.0f);
}

TEST_F(Faults, PointToPointMismatchesAreReportedByTheReceiver) {
  const int n = world().size();
  const int rank = world().rank();
  if (n < 2) GTEST_SKIP() << "a missing rank needs at least 2 ranks";
  for (bool check : {true, false}) {
    for (int64_t limit : {int64_t{INT_MAX}, int64_t{7}}) {  // 7: messages made of derived datatypes
      SCOPED_TRACE(std::string(check ? "with header" : "without header") + ", limit " + std::to_string(limit));
      std::unique_ptr<comm::Communicator> group = fault_group(std::chrono::seconds(60), check);
      comm::MpiOptions options = comm::mpi_options(*group);
      options.max_elements_per_call = limit;
      comm::set_mpi_options(*group, options);
      std::vector<float> data(200, 1.0f);
      std::vector<float> next(50, 0.0f);
      for (size_t i = 0; i < next.size(); ++i) next[i] = static_cast<float>(i);
      if (rank == 0) {
        group->send(data.data(), 100, DType::F32, 1, 4);  // the receiver expects 120
        group->send(data.data(), 120, DType::F32, 1, 4);  // the receiver expects 100
        if (check) group->send(data.data(), 100, DType::F16, 1, 4);  // the receiver expects bf16
        group->send(next.data(), 50, DType::F32, 1, 4);   // agreed: the stream is still in step
      } else if (rank == 1) {
        std::string message = error_of([&] { group->recv(data.data(), 120, DType::F32, 0, 4); });
        EXPECT_NE(message.find("recv #1 from rank 0 (world rank 0), tag 4, f32 x 120"), std::string::npos) << message;
        EXPECT_NE(message.find(check ? "rank 0 (world rank 0) sends f32 x 100, this rank expects f32 x 120"
                                     : "sends fewer elements (100) than the 120"),
                  std::string::npos)
            << message;
        message = error_of([&] { group->recv(data.data(), 100, DType::F32, 0, 4); });
        EXPECT_NE(message.find(check ? "sends f32 x 120, this rank expects f32 x 100" : "sends more than the 100 elements"),
                  std::string::npos)
            << message;
        if (check) {
          message = error_of([&] { group->recv(data.data(), 100, DType::BF16, 0, 4); });
          EXPECT_NE(message.find("sends f16 x 100, this rank expects bf16 x 100"), std::string::npos) << message;
        }
        std::vector<float> got(50, -1.0f);
        group->recv(got.data(), 50, DType::F32, 0, 4);
        EXPECT_EQ(got, next);
      }
      world().barrier();
    }
  }
}

TEST_F(Faults, ReceiveWithNoSenderTimesOutNamingThePeer) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "a missing rank needs at least 2 ranks";
  std::unique_ptr<comm::Communicator> group = fault_group(std::chrono::milliseconds(300));
  if (world().rank() == 0) {
    float x = 0;
    const auto start = Clock::now();
    const std::string message = error_of([&] { group->recv(&x, 1, DType::F32, n - 1, 11); });
    EXPECT_LT(seconds_since(start), 5.0);
    EXPECT_NE(message.find("recv #1 from rank " + std::to_string(n - 1) + " (world rank " + std::to_string(n - 1) +
                           "), tag 11, f32 x 1 timed out after"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("never sent a matching message"), std::string::npos) << message;
  }
  world().barrier();
}

}  // namespace
}  // namespace loom::mpi_test
