// Every collective of the mpi backend against a serial reference, on data each rank generates
// for every other rank from a seed: sizes 0, 1, a prime and a few MiB, dtypes f32, bf16, f16.
#include <algorithm>
#include <numeric>

#include "loom/comm/mpi/backend.h"
#include "mpi_test_util.h"

namespace loom::mpi_test {
namespace {

using comm::ReduceOp;

class Collectives : public MpiTest {};

std::string label(DType dtype, int64_t count, const std::string& extra = "") {
  return dtype_name(dtype) + " x " + std::to_string(count) + (extra.empty() ? "" : ", " + extra);
}

TEST_F(Collectives, AllReduceMatchesSerialReference) {
  const int n = world().size();
  uint64_t seed = 100;
  for (DType dtype : float_dtypes()) {
    for (ReduceOp op : reduce_ops()) {
      for (int64_t count : awkward_sizes()) {
        SCOPED_TRACE(label(dtype, count, comm::reduce_op_name(op)));
        ++seed;
        std::vector<std::byte> data = make_data(seed, world().rank(), 0, count, dtype);
        world().all_reduce(data.data(), count, dtype, op);
        EXPECT_TRUE(matches_reduction(data.data(), count, dtype, op, seed, all_ranks(n), 0));
        // Every rank holds bitwise the same result (data-parallel replicas stay identical).
        const std::vector<float> values = as_f32(data.data(), count, dtype);
        float checksum = 0;
        for (size_t i = 0; i < values.size(); ++i) checksum += values[i] * static_cast<float>(i % 7 + 1);
        std::vector<float> sums(static_cast<size_t>(n));
        world().all_gather(&checksum, sums.data(), 1, DType::F32);
        for (int r = 0; r < n; ++r) EXPECT_EQ(std::memcmp(&sums[0], &sums[static_cast<size_t>(r)], 4), 0) << "rank " << r;
      }
    }
  }
}

TEST_F(Collectives, ReduceScatterMatchesSerialReference) {
  const int n = world().size();
  const int rank = world().rank();
  uint64_t seed = 200;
  for (DType dtype : float_dtypes()) {
    for (ReduceOp op : reduce_ops()) {
      for (int64_t block : {int64_t{0}, int64_t{1}, int64_t{7919}, int64_t{131101}}) {
        if (block > 7919 && op != ReduceOp::Sum) continue;  // large blocks: one op is enough
        SCOPED_TRACE(label(dtype, block, comm::reduce_op_name(op)));
        ++seed;
        const std::vector<std::byte> send = make_data(seed, rank, 0, block * n, dtype);
        std::vector<std::byte> recv(static_cast<size_t>(block) * dtype_size(dtype));
        world().reduce_scatter(send.data(), recv.data(), block, dtype, op);
        EXPECT_TRUE(matches_reduction(recv.data(), block, dtype, op, seed, all_ranks(n), block * rank));
      }
    }
  }
}

TEST_F(Collectives, ReduceScatterIntoItsOwnSendBuffer) {
  const int n = world().size();
  const int rank = world().rank();
  const int64_t block = 257;
  const uint64_t seed = 250;
  // recv aliases this rank's block of send: MPI forbids the aliasing, the backend must cope.
  std::vector<std::byte> buffer = make_data(seed, rank, 0, block * n, DType::F32);
  void* recv = buffer.data() + static_cast<size_t>(rank * block) * 4;
  world().reduce_scatter(buffer.data(), recv, block, DType::F32, ReduceOp::Sum);
  EXPECT_TRUE(matches_reduction(recv, block, DType::F32, ReduceOp::Sum, seed, all_ranks(n), block * rank));
}

TEST_F(Collectives, AllGatherMatchesEveryRanksData) {
  const int n = world().size();
  const int rank = world().rank();
  uint64_t seed = 300;
  for (DType dtype : float_dtypes()) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7919}, int64_t{131101}}) {
      SCOPED_TRACE(label(dtype, count));
      ++seed;
      const size_t element = dtype_size(dtype);
      const std::vector<std::byte> send = make_data(seed, rank, 0, count, dtype);
      std::vector<std::byte> recv(static_cast<size_t>(count * n) * element);
      world().all_gather(send.data(), recv.data(), count, dtype);
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(matches_samples(recv.data() + static_cast<size_t>(r * count) * element, count, dtype, seed, r, 0));
      }
      // In place: this rank's block already sits in recv.
      std::vector<std::byte> in_place(recv.size());
      if (count > 0) std::memcpy(in_place.data() + static_cast<size_t>(rank * count) * element, send.data(), send.size());
      world().all_gather(in_place.data() + static_cast<size_t>(rank * count) * element, in_place.data(), count, dtype);
      EXPECT_EQ(in_place, recv);
    }
  }
}

TEST_F(Collectives, AllGatherVWithZeroCounts) {
  const int n = world().size();
  const int rank = world().rank();
  const std::vector<std::vector<int64_t>> patterns = [&] {
    std::vector<std::vector<int64_t>> p;
    std::vector<int64_t> mixed(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) mixed[static_cast<size_t>(r)] = r % 3 == 1 ? 0 : 7919 + 13 * r;
    p.push_back(mixed);
    p.push_back(std::vector<int64_t>(static_cast<size_t>(n), 0));
    std::vector<int64_t> one(static_cast<size_t>(n), 0);
    one[static_cast<size_t>(n - 1)] = 100003;
    p.push_back(one);
    std::vector<int64_t> ones(static_cast<size_t>(n), 1);
    p.push_back(ones);
    return p;
  }();
  uint64_t seed = 400;
  for (DType dtype : float_dtypes()) {
    for (size_t pi = 0; pi < patterns.size(); ++pi) {
      SCOPED_TRACE(dtype_name(dtype) + " pattern " + std::to_string(pi));
      ++seed;
      const std::vector<int64_t>& counts = patterns[pi];
      const size_t element = dtype_size(dtype);
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      const std::vector<std::byte> send = make_data(seed, rank, 0, counts[static_cast<size_t>(rank)], dtype);
      std::vector<std::byte> recv(static_cast<size_t>(total) * element);
      world().all_gather_v(send.data(), recv.data(), counts, dtype);
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(matches_samples(recv.data() + static_cast<size_t>(offset) * element, counts[static_cast<size_t>(r)],
                                    dtype, seed, r, 0));
        offset += counts[static_cast<size_t>(r)];
      }
    }
  }
}

TEST_F(Collectives, BroadcastFromEveryRoot) {
  const int n = world().size();
  const int rank = world().rank();
  uint64_t seed = 500;
  for (DType dtype : float_dtypes()) {
    for (int64_t count : awkward_sizes()) {
      for (int root = 0; root < n; ++root) {
        if (count > 7919 && root != n - 1) continue;
        SCOPED_TRACE(label(dtype, count, "root " + std::to_string(root)));
        ++seed;
        std::vector<std::byte> data =
            rank == root ? make_data(seed, root, 0, count, dtype) : std::vector<std::byte>(count * dtype_size(dtype));
        world().broadcast(data.data(), count, dtype, root);
        EXPECT_TRUE(matches_samples(data.data(), count, dtype, seed, root, 0));
      }
    }
  }
}

TEST_F(Collectives, ReduceToARoot) {
  const int n = world().size();
  const int rank = world().rank();
  uint64_t seed = 600;
  for (DType dtype : float_dtypes()) {
    for (ReduceOp op : reduce_ops()) {
      for (int64_t count : awkward_sizes()) {
        if (count > 7919 && op != ReduceOp::Sum) continue;
        for (int root : {0, n - 1}) {
          SCOPED_TRACE(label(dtype, count, comm::reduce_op_name(op) + ", root " + std::to_string(root)));
          ++seed;
          const std::vector<std::byte> send = make_data(seed, rank, 0, count, dtype);
          std::vector<std::byte> recv(rank == root ? send.size() : 0);
          world().reduce(send.data(), rank == root ? recv.data() : nullptr, count, dtype, op, root);
          if (rank == root) {
            EXPECT_TRUE(matches_reduction(recv.data(), count, dtype, op, seed, all_ranks(n), 0));
          }
          // In place on the root.
          std::vector<std::byte> data = send;
          world().reduce(data.data(), rank == root ? data.data() : nullptr, count, dtype, op, root);
          if (rank == root) {
            EXPECT_EQ(data, recv);
          }
        }
      }
    }
  }
}

TEST_F(Collectives, AllToAllMatchesEveryRanksBlocks) {
  const int n = world().size();
  const int rank = world().rank();
  uint64_t seed = 700;
  for (DType dtype : float_dtypes()) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7919}, int64_t{65537}}) {
      SCOPED_TRACE(label(dtype, count));
      ++seed;
      const size_t element = dtype_size(dtype);
      // Block r of rank s holds samples (seed, s) at [r * count, (r + 1) * count).
      const std::vector<std::byte> send = make_data(seed, rank, 0, count * n, dtype);
      std::vector<std::byte> recv(send.size());
      world().all_to_all(send.data(), recv.data(), count, dtype);
      for (int s = 0; s < n; ++s) {
        EXPECT_TRUE(
            matches_samples(recv.data() + static_cast<size_t>(s * count) * element, count, dtype, seed, s, rank * count));
      }
    }
  }
}

TEST_F(Collectives, AllToAllVWithZeroCounts) {
  const int n = world().size();
  const int rank = world().rank();
  // counts(s, d): what rank s sends to rank d; every rank can compute the whole matrix.
  auto pattern = [](int p, int s, int d) -> int64_t {
    switch (p) {
      case 0: return (s + 2 * d) % 4 == 0 ? 0 : 1 + 97 * s + 13 * d;
      case 1: return 0;
      case 2: return d == 0 ? 4099 : 0;  // everyone sends to rank 0 only
      default: return s == d ? 0 : 1;
    }
  };
  uint64_t seed = 800;
  for (DType dtype : float_dtypes()) {
    for (int p = 0; p < 4; ++p) {
      SCOPED_TRACE(dtype_name(dtype) + " pattern " + std::to_string(p));
      ++seed;
      const size_t element = dtype_size(dtype);
      std::vector<int64_t> send_counts(static_cast<size_t>(n));
      std::vector<int64_t> recv_counts(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        send_counts[static_cast<size_t>(r)] = pattern(p, rank, r);
        recv_counts[static_cast<size_t>(r)] = pattern(p, r, rank);
      }
      const int64_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
      const int64_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0});
      const std::vector<std::byte> send = make_data(seed, rank, 0, send_total, dtype);
      std::vector<std::byte> recv(static_cast<size_t>(recv_total) * element);
      world().all_to_all_v(send.data(), send_counts, recv.data(), recv_counts, dtype);
      int64_t offset = 0;
      for (int s = 0; s < n; ++s) {
        // Where rank s's block for this rank starts in s's send buffer.
        int64_t first = 0;
        for (int d = 0; d < rank; ++d) first += pattern(p, s, d);
        EXPECT_TRUE(matches_samples(recv.data() + static_cast<size_t>(offset) * element,
                                    recv_counts[static_cast<size_t>(s)], dtype, seed, s, first));
        offset += recv_counts[static_cast<size_t>(s)];
      }
    }
  }
}

TEST_F(Collectives, BarrierOrdersSideEffects) {
  // A rank that leaves the barrier has seen every rank enter it: checked through the arrival of
  // a message each rank sent before its barrier.
  const int n = world().size();
  const int rank = world().rank();
  int32_t token = rank;
  int32_t got = -1;
  const int next = (rank + 1) % n;
  const int previous = (rank - 1 + n) % n;
  comm::WorkHandle recv = world().recv_async(&got, 1, DType::I32, previous, 3);
  world().send(&token, 1, DType::I32, next, 3);
  world().barrier();
  recv->wait();
  EXPECT_EQ(got, previous);
}

// Every operation again with MPI calls limited to a few elements, which takes the chunked paths
// (the ones real runs take beyond 2^31 elements per call).
TEST_F(Collectives, ChunkedCallsMatchTheReference) {
  const int n = world().size();
  const int rank = world().rank();
  std::unique_ptr<comm::Communicator> group = world().split(0, rank, "chunked");
  comm::MpiOptions options = comm::mpi_options(*group);
  options.max_elements_per_call = 5;
  comm::set_mpi_options(*group, options);
  uint64_t seed = 900;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{13}, int64_t{101}}) {
      SCOPED_TRACE(label(dtype, count));
      const size_t element = dtype_size(dtype);
      ++seed;
      std::vector<std::byte> data = make_data(seed, rank, 0, count, dtype);
      group->all_reduce(data.data(), count, dtype, ReduceOp::Sum);
      EXPECT_TRUE(matches_reduction(data.data(), count, dtype, ReduceOp::Sum, seed, all_ranks(n), 0));

      ++seed;
      const std::vector<std::byte> scatter_send = make_data(seed, rank, 0, count * n, dtype);
      std::vector<std::byte> block(static_cast<size_t>(count) * element);
      group->reduce_scatter(scatter_send.data(), block.data(), count, dtype, ReduceOp::Avg);
      EXPECT_TRUE(matches_reduction(block.data(), count, dtype, ReduceOp::Avg, seed, all_ranks(n), count * rank));

      ++seed;
      const std::vector<std::byte> mine = make_data(seed, rank, 0, count, dtype);
      std::vector<std::byte> gathered(static_cast<size_t>(count * n) * element);
      group->all_gather(mine.data(), gathered.data(), count, dtype);
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(matches_samples(gathered.data() + static_cast<size_t>(r * count) * element, count, dtype, seed, r, 0));
      }

      std::vector<int64_t> counts(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = r % 2 == 0 ? count : count / 2;
      const std::vector<std::byte> mine_v = make_data(seed, rank, 0, counts[static_cast<size_t>(rank)], dtype);
      std::vector<std::byte> gathered_v(
          static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0})) * element);
      group->all_gather_v(mine_v.data(), gathered_v.data(), counts, dtype);
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(matches_samples(gathered_v.data() + static_cast<size_t>(offset) * element,
                                    counts[static_cast<size_t>(r)], dtype, seed, r, 0));
        offset += counts[static_cast<size_t>(r)];
      }

      ++seed;
      std::vector<std::byte> cast = rank == 1 % n ? make_data(seed, 1 % n, 0, count, dtype) : std::vector<std::byte>(block.size());
      group->broadcast(cast.data(), count, dtype, 1 % n);
      EXPECT_TRUE(matches_samples(cast.data(), count, dtype, seed, 1 % n, 0));

      ++seed;
      const std::vector<std::byte> reduce_send = make_data(seed, rank, 0, count, dtype);
      std::vector<std::byte> reduced(block.size());
      group->reduce(reduce_send.data(), rank == 0 ? reduced.data() : nullptr, count, dtype, ReduceOp::Max, 0);
      if (rank == 0) {
        EXPECT_TRUE(matches_reduction(reduced.data(), count, dtype, ReduceOp::Max, seed, all_ranks(n), 0));
      }

      ++seed;
      const std::vector<std::byte> a2a_send = make_data(seed, rank, 0, count * n, dtype);
      std::vector<std::byte> a2a_recv(a2a_send.size());
      group->all_to_all(a2a_send.data(), a2a_recv.data(), count, dtype);
      for (int s = 0; s < n; ++s) {
        EXPECT_TRUE(matches_samples(a2a_recv.data() + static_cast<size_t>(s * count) * element, count, dtype, seed, s,
                                    rank * count));
      }

      ++seed;
      const std::vector<std::byte> p2p_send = make_data(seed, rank, 0, count, dtype);
      std::vector<std::byte> p2p_recv(p2p_send.size());
      comm::WorkHandle r = group->recv_async(p2p_recv.data(), count, dtype, (rank - 1 + n) % n, 9);
      group->send(p2p_send.data(), count, dtype, (rank + 1) % n, 9);
      r->wait();
      EXPECT_TRUE(matches_samples(p2p_recv.data(), count, dtype, seed, (rank - 1 + n) % n, 0));
    }
  }
}

}  // namespace
}  // namespace loom::mpi_test

namespace loom::mpi_test {
namespace {

// With the agreement handshake off, every operation runs on the group's communication thread
// straight into MPI; the results are the same.
TEST_F(Collectives, WithoutAgreementChecksResultsAreTheSame) {
  const int n = world().size();
  const int rank = world().rank();
  std::unique_ptr<comm::Communicator> group = world().split(0, rank, "unchecked");
  comm::MpiOptions options = comm::mpi_options(*group);
  options.check_agreement = false;
  comm::set_mpi_options(*group, options);
  uint64_t seed = 950;
  for (DType dtype : float_dtypes()) {
    for (int64_t count : awkward_sizes()) {
      SCOPED_TRACE(label(dtype, count));
      const size_t element = dtype_size(dtype);
      ++seed;
      std::vector<std::byte> data = make_data(seed, rank, 0, count, dtype);
      group->all_reduce(data.data(), count, dtype, ReduceOp::Avg);
      EXPECT_TRUE(matches_reduction(data.data(), count, dtype, ReduceOp::Avg, seed, all_ranks(n), 0));

      ++seed;
      const int64_t block = count / n;
      const std::vector<std::byte> send = make_data(seed, rank, 0, block * n, dtype);
      std::vector<std::byte> recv(static_cast<size_t>(block) * element);
      group->reduce_scatter(send.data(), recv.data(), block, dtype, ReduceOp::Sum);
      EXPECT_TRUE(matches_reduction(recv.data(), block, dtype, ReduceOp::Sum, seed, all_ranks(n), block * rank));

      ++seed;
      std::vector<std::byte> cast =
          rank == n - 1 ? make_data(seed, n - 1, 0, count, dtype) : std::vector<std::byte>(data.size());
      group->broadcast(cast.data(), count, dtype, n - 1);
      EXPECT_TRUE(matches_samples(cast.data(), count, dtype, seed, n - 1, 0));

      ++seed;
      std::vector<int64_t> counts(static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) counts[static_cast<size_t>(r)] = (r % 2) ? 0 : block;
      const std::vector<std::byte> mine = make_data(seed, rank, 0, counts[static_cast<size_t>(rank)], dtype);
      std::vector<std::byte> gathered(static_cast<size_t>(std::accumulate(counts.begin(), counts.end(), int64_t{0})) *
                                      element);
      group->all_gather_v(mine.data(), gathered.data(), counts, dtype);
      int64_t offset = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(matches_samples(gathered.data() + static_cast<size_t>(offset) * element,
                                    counts[static_cast<size_t>(r)], dtype, seed, r, 0));
        offset += counts[static_cast<size_t>(r)];
      }
      group->barrier();
    }
  }
}

}  // namespace
}  // namespace loom::mpi_test
