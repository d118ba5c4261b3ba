// Groups made by split (shaped like a mesh's tp, dp and pp groups), async operations on two
// groups overlapping, completion in issue order, and point-to-point messages with tags.
#include <thread>

#include "loom/comm/mpi/backend.h"
#include "mpi_test_util.h"

namespace loom::mpi_test {
namespace {

using comm::ReduceOp;

class Groups : public MpiTest {};

// A tp x dp x pp mesh in Megatron-Core's order (tp fastest): 2x2x2 on 8 ranks, 2x2 on 4.
struct MeshShape {
  int tp = 2, dp = 1, pp = 1;
};
MeshShape mesh_for(int world_size) {
  MeshShape shape;
  shape.pp = world_size >= 8 ? 2 : 1;
  shape.dp = world_size / (shape.tp * shape.pp);
  return shape;
}

struct MeshGroups {
  std::unique_ptr<comm::Communicator> tp, dp, pp;
  std::vector<int> tp_members, dp_members, pp_members;
};

MeshGroups split_mesh(comm::Communicator& world, const MeshShape& m) {
  const int w = world.rank();
  const int tp_rank = w % m.tp;
  const int dp_rank = (w / m.tp) % m.dp;
  const int pp_rank = w / (m.tp * m.dp);
  MeshGroups g;
  g.tp = world.split(pp_rank * m.dp + dp_rank, tp_rank, "tp-" + std::to_string(pp_rank * m.dp + dp_rank));
  g.dp = world.split(pp_rank * m.tp + tp_rank, dp_rank, "dp-" + std::to_string(pp_rank * m.tp + tp_rank));
  g.pp = world.split(dp_rank * m.tp + tp_rank, pp_rank, "pp-" + std::to_string(dp_rank * m.tp + tp_rank));
  for (int t = 0; t < m.tp; ++t) g.tp_members.push_back(pp_rank * m.tp * m.dp + dp_rank * m.tp + t);
  for (int d = 0; d < m.dp; ++d) g.dp_members.push_back(pp_rank * m.tp * m.dp + d * m.tp + tp_rank);
  for (int p = 0; p < m.pp; ++p) g.pp_members.push_back(p * m.tp * m.dp + dp_rank * m.tp + tp_rank);
  return g;
}

TEST_F(Groups, MeshShapedSplitsHaveTheRightMembersAndReduceOverThem) {
  if (world().size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  const MeshShape m = mesh_for(world().size());
  MeshGroups g = split_mesh(world(), m);
  EXPECT_EQ(g.tp->world_ranks(), g.tp_members);
  EXPECT_EQ(g.dp->world_ranks(), g.dp_members);
  EXPECT_EQ(g.pp->world_ranks(), g.pp_members);
  EXPECT_EQ(g.tp->size(), m.tp);
  EXPECT_EQ(g.dp->size(), m.dp);
  EXPECT_EQ(g.pp->size(), m.pp);
  EXPECT_EQ(g.tp->backend(), "mpi");
  EXPECT_EQ(comm::mpi_arrival_counters(*g.tp), "shared-memory window");

  uint64_t seed = 1000;
  for (DType dtype : float_dtypes()) {
    for (int64_t count : awkward_sizes()) {
      SCOPED_TRACE(dtype_name(dtype) + " x " + std::to_string(count));
      for (auto* entry : {&g.tp, &g.dp, &g.pp}) {
        comm::Communicator& group = **entry;
        const std::vector<int>& members = group.world_ranks();
        ++seed;
        std::vector<std::byte> data = make_data(seed, world().rank(), 0, count, dtype);
        group.all_reduce(data.data(), count, dtype, ReduceOp::Sum);
        EXPECT_TRUE(matches_reduction(data.data(), count, dtype, ReduceOp::Sum, seed, members, 0)) << group.name();
      }
    }
  }
}

TEST_F(Groups, SplitWithNegativeColorJoinsNoGroupAndKeyOrdersRanks) {
  const int n = world().size();
  const int rank = world().rank();
  // Odd ranks stay out; even ranks form a group ordered by descending world rank.
  std::unique_ptr<comm::Communicator> evens = world().split(rank % 2 == 0 ? 0 : -1, n - rank, "evens");
  if (rank % 2 != 0) {
    EXPECT_EQ(evens, nullptr);
    return;
  }
  ASSERT_NE(evens, nullptr);
  std::vector<int> expected;
  for (int r = (n - 1) / 2 * 2; r >= 0; r -= 2) expected.push_back(r);
  EXPECT_EQ(evens->world_ranks(), expected);
  EXPECT_EQ(evens->name(), "evens");
  int32_t mine = rank;
  std::vector<int32_t> all(expected.size());
  evens->all_gather(&mine, all.data(), 1, DType::I32);
  EXPECT_EQ(std::vector<int>(all.begin(), all.end()), expected);
  // A split of a split inherits the options.
  comm::MpiOptions options = comm::mpi_options(*evens);
  options.comm.timeout = std::chrono::milliseconds(4321);
  comm::set_mpi_options(*evens, options);
  std::unique_ptr<comm::Communicator> child = evens->split(0, 0, "evens-child");
  EXPECT_EQ(comm::mpi_options(*child).comm.timeout, std::chrono::milliseconds(4321));
}

TEST_F(Groups, AsyncOperationsOnTwoGroupsOverlap) {
  if (world().size() % 4 != 0) GTEST_SKIP() << "needs a multiple of 4 ranks";
  MeshGroups g = split_mesh(world(), mesh_for(world().size()));
  const int rank = world().rank();
  const int64_t count = 262147;  // a prime, 1 MiB of f32
  const uint64_t seed = 1100;
  // Several operations in flight on tp and dp at once, waited for in reverse order.
  std::vector<std::vector<std::byte>> tp_data, dp_data;
  std::vector<comm::WorkHandle> handles;
  for (int i = 0; i < 3; ++i) {
    tp_data.push_back(make_data(seed + i, rank, 0, count, DType::BF16));
    dp_data.push_back(make_data(seed + 10 + i, rank, 0, count, DType::F32));
  }
  for (int i = 0; i < 3; ++i) {
    handles.push_back(g.tp->all_reduce_async(tp_data[i].data(), count, DType::BF16, ReduceOp::Sum));
    handles.push_back(g.dp->all_reduce_async(dp_data[i].data(), count, DType::F32, ReduceOp::Avg));
  }
  std::vector<std::byte> gathered(static_cast<size_t>(count) * 4 * g.tp->size());
  const std::vector<std::byte> mine = make_data(seed + 20, rank, 0, count, DType::F32);
  handles.push_back(g.tp->all_gather_async(mine.data(), gathered.data(), count, DType::F32));
  // Computation while they run.
  double busy = 0;
  for (int i = 0; i < 2000000; ++i) busy += 1.0 / (i + 1);
  EXPECT_GT(busy, 1.0);
  for (auto it = handles.rbegin(); it != handles.rend(); ++it) (*it)->wait();
  for (auto& handle : handles) EXPECT_TRUE(handle->test());
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(matches_reduction(tp_data[i].data(), count, DType::BF16, ReduceOp::Sum, seed + i, g.tp_members, 0));
    EXPECT_TRUE(matches_reduction(dp_data[i].data(), count, DType::F32, ReduceOp::Avg, seed + 10 + i, g.dp_members, 0));
  }
  for (int t = 0; t < g.tp->size(); ++t) {
    EXPECT_TRUE(matches_samples(gathered.data() + static_cast<size_t>(t * count) * 4, count, DType::F32, seed + 20,
                                g.tp_members[static_cast<size_t>(t)], 0));
  }
}

TEST_F(Groups, AsyncOperationProgressesWhileTheCallerIsAway) {
  // Issued, then no call into the communicator for a while: the group's communication thread
  // runs it meanwhile, so it is complete when the caller comes back.
  const int n = world().size();
  std::vector<std::byte> data = make_data(1250, world().rank(), 0, 1000, DType::F32);
  comm::WorkHandle handle = world().all_reduce_async(data.data(), 1000, DType::F32, ReduceOp::Sum);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_TRUE(handle->test());
  handle->wait();
  EXPECT_TRUE(matches_reduction(data.data(), 1000, DType::F32, ReduceOp::Sum, 1250, all_ranks(n), 0));
}

TEST_F(Groups, OperationsCompleteInIssueOrder) {
  const int rank = world().rank();
  const int n = world().size();
  const uint64_t seed = 1200;
  std::vector<std::vector<std::byte>> data;
  std::vector<comm::WorkHandle> handles;
  for (int i = 0; i < 8; ++i) data.push_back(make_data(seed + i, rank, 0, 4099 * (i + 1), DType::F32));
  for (int i = 0; i < 8; ++i) {
    handles.push_back(world().all_reduce_async(data[i].data(), 4099 * (i + 1), DType::F32, ReduceOp::Sum));
  }
  handles.back()->wait();
  // Waiting for the last one finished all that came before it.
  for (auto& handle : handles) EXPECT_TRUE(handle->test());
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(matches_reduction(data[i].data(), 4099 * (i + 1), DType::F32, ReduceOp::Sum, seed + i, all_ranks(n), 0));
  }
  // Waiting twice is allowed.
  handles.front()->wait();
}

TEST_F(Groups, TestPollsUntilDone) {
  const int rank = world().rank();
  const int n = world().size();
  std::vector<std::byte> data = make_data(1300, rank, 0, 100003, DType::F16);
  comm::WorkHandle handle = world().all_reduce_async(data.data(), 100003, DType::F16, ReduceOp::Max);
  while (!handle->test()) std::this_thread::yield();
  EXPECT_TRUE(matches_reduction(data.data(), 100003, DType::F16, ReduceOp::Max, 1300, all_ranks(n), 0));
}

TEST_F(Groups, SendRecvMatchesByTagInIssueOrder) {
  const int n = world().size();
  const int rank = world().rank();
  const int next = (rank + 1) % n;
  const int previous = (rank - 1 + n) % n;
  const uint64_t seed = 1400;
  // Two tags, two messages each; sends issued tag 2 first, receives tag 1 first.
  std::vector<std::vector<std::byte>> out;
  for (int i = 0; i < 4; ++i) out.push_back(make_data(seed + i, rank, 0, 1000 + i, DType::BF16));
  std::vector<std::vector<std::byte>> in(4);
  for (int i = 0; i < 4; ++i) in[i].resize(out[i].size());
  std::vector<comm::WorkHandle> recvs;
  recvs.push_back(world().recv_async(in[0].data(), 1000, DType::BF16, previous, 1));
  recvs.push_back(world().recv_async(in[1].data(), 1001, DType::BF16, previous, 1));
  recvs.push_back(world().recv_async(in[2].data(), 1002, DType::BF16, previous, 2));
  recvs.push_back(world().recv_async(in[3].data(), 1003, DType::BF16, previous, 2));
  std::vector<comm::WorkHandle> sends;
  sends.push_back(world().send_async(out[2].data(), 1002, DType::BF16, next, 2));
  sends.push_back(world().send_async(out[0].data(), 1000, DType::BF16, next, 1));
  sends.push_back(world().send_async(out[3].data(), 1003, DType::BF16, next, 2));
  sends.push_back(world().send_async(out[1].data(), 1001, DType::BF16, next, 1));
  for (auto& s : sends) s->wait();
  for (auto& r : recvs) r->wait();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(matches_samples(in[i].data(), 1000 + i, DType::BF16, seed + i, previous, 0));

  // Zero-length and large messages, blocking, pipeline-style between pairs.
  for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{1048583}}) {
    SCOPED_TRACE(count);
    const std::vector<std::byte> big = make_data(seed + 10, rank, 0, count, DType::F32);
    std::vector<std::byte> got(big.size());
    if (n >= 2 && rank < n / 2 * 2) {
      const int partner = rank ^ 1;
      if (rank % 2 == 0) {
        world().send(big.data(), count, DType::F32, partner, 5);
        world().recv(got.data(), count, DType::F32, partner, 5);
      } else {
        world().recv(got.data(), count, DType::F32, partner, 5);
        world().send(big.data(), count, DType::F32, partner, 5);
      }
      EXPECT_TRUE(matches_samples(got.data(), count, DType::F32, seed + 10, partner, 0));
    }
  }
}

// A batch of sends and recvs (exchange_async: the pipeline's and ring attention's messages) over
// MPI processes: every rank sends to both neighbours first, large messages (past any eager
// limit) and an empty one, and receives theirs in the same batch; each handle completes, the
// bytes are the senders'.
TEST_F(Groups, ExchangeSendsToBothNeighboursBeforeReceiving) {
  const int n = world().size(), rank = world().rank();
  const int next = (rank + 1) % n, previous = (rank - 1 + n) % n;
  const uint64_t seed = 1500;
  const int64_t big = 1048583, small = 0;
  const std::vector<std::byte> forward = make_data(seed, rank, 0, big, DType::F32),
                               backward = make_data(seed + 1, rank, 0, big + 5, DType::F32);
  std::vector<std::byte> from_previous(forward.size()), from_next(backward.size());
  std::vector<comm::PeerOp> ops = {comm::PeerOp::send(forward.data(), big, DType::F32, next, 7),
                                   comm::PeerOp::send(backward.data(), big + 5, DType::F32, previous, 8),
                                   comm::PeerOp::send(nullptr, small, DType::F32, next, 9),
                                   comm::PeerOp::recv(from_previous.data(), big, DType::F32, previous, 7),
                                   comm::PeerOp::recv(from_next.data(), big + 5, DType::F32, next, 8),
                                   comm::PeerOp::recv(nullptr, small, DType::F32, previous, 9)};
  std::vector<comm::WorkHandle> handles = world().exchange_async(ops);
  ASSERT_EQ(handles.size(), ops.size());
  comm::all_of(std::move(handles))->wait();
  EXPECT_TRUE(matches_samples(from_previous.data(), big, DType::F32, seed, previous, 0));
  EXPECT_TRUE(matches_samples(from_next.data(), big + 5, DType::F32, seed + 1, next, 0));
}

TEST_F(Groups, PointToPointRejectsBadPeersAndTags) {
  int32_t x = 0;
  EXPECT_THROW(world().send(&x, 1, DType::I32, world().size(), 0), Error);
  EXPECT_THROW(world().send(&x, 1, DType::I32, world().rank(), 0), Error);
  EXPECT_THROW(world().recv(&x, 1, DType::I32, 0, -1), Error);
}

}  // namespace
}  // namespace loom::mpi_test
