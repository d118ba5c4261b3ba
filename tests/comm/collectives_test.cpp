// Every collective of the threads backend against the serial reference (serial_reference.h) on
// random data: 1, 2, 3, 4 and 8 ranks; f32, bf16 and f16; element counts 0, 1, a prime that is
// copied through shared memory (1009), a prime read in place (16411: just above 64 KiB of f32)
// and 1.5 Mi elements (the chunked bandwidth-optimal paths: every dtype on 8 ranks, f32 on 3,
// where the slices are uneven). Tolerances of
// reductions are stated in typed_data.h; data movement is bit-exact.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "loom/comm/launch.h"
#include "serial_reference.h"
#include "typed_data.h"

namespace loom::comm {
namespace {

namespace ref = reference;
using testing::compare_exact;
using testing::compare_reduced;
using testing::decode;
using testing::encode;
using testing::random_values;

constexpr int64_t kLarge = 3 << 19;  // 1.5 Mi elements: 6 MiB of f32 per rank
const std::vector<int> kRankCounts = {1, 2, 3, 4, 8};
const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::F16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

LaunchOptions threads(int ranks) {
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = ranks;
  options.comm.timeout = std::chrono::seconds(60);
  return options;
}

bool has_large(int ranks, DType dtype) { return ranks == 8 || (ranks == 3 && dtype == DType::F32); }

std::vector<int64_t> counts_for(int ranks, DType dtype, int64_t large) {
  std::vector<int64_t> counts = {0, 1, 1009, 16411};
  if (has_large(ranks, dtype)) counts.push_back(large);
  return counts;
}

// The ops a configuration runs: all three for the small counts, one (varying with the dtype) for
// the large one, to keep the suite quick.
std::vector<ReduceOp> ops_for(int64_t count, int64_t large, DType dtype) {
  if (count != large) return kOps;
  return {kOps[static_cast<int>(dtype) % kOps.size()]};
}

struct Inputs {
  ref::Buffers values;                        // what the reference sees
  std::vector<std::vector<std::byte>> bytes;  // what rank r passes to the collective
};

Inputs make_inputs(int ranks, const std::function<int64_t(int)>& count_of, DType dtype, uint64_t salt) {
  Inputs in;
  for (int r = 0; r < ranks; ++r) {
    in.values.push_back(random_values(count_of(r), dtype, salt * 1000003 + static_cast<uint64_t>(r) * 7919 +
                                                               static_cast<uint64_t>(dtype) * 31 +
                                                               static_cast<uint64_t>(count_of(r))));
    in.bytes.push_back(encode(in.values.back(), dtype));
  }
  return in;
}

std::string label(int ranks, DType dtype, int64_t count) {
  return std::to_string(ranks) + " ranks, " + dtype_name(dtype) + ", count " + std::to_string(count);
}

TEST(Collectives, AllReduceMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      for (int64_t count : counts_for(ranks, dtype, kLarge)) {
        SCOPED_TRACE(label(ranks, dtype, count));
        const Inputs in = make_inputs(ranks, [&](int) { return count; }, dtype, 1);
        const std::vector<ReduceOp> ops = ops_for(count, kLarge, dtype);
        std::vector<std::vector<std::vector<std::byte>>> out(ops.size(), std::vector<std::vector<std::byte>>(ranks));
        launch(threads(ranks), [&](Communicator& world) {
          for (size_t i = 0; i < ops.size(); ++i) {
            std::vector<std::byte> data = in.bytes[world.rank()];
            world.all_reduce(data.data(), count, dtype, ops[i]);
            out[i][world.rank()] = std::move(data);
          }
        });
        const std::vector<double> abs_sum = ref::abs_sum(in.values);
        for (size_t i = 0; i < ops.size(); ++i) {
          const std::vector<double> want = ref::all_reduce(in.values, ops[i]);
          for (int r = 0; r < ranks; ++r) {
            EXPECT_EQ(compare_reduced(decode(out[i][r], dtype), want, abs_sum, dtype, ops[i], ranks), "")
                << "rank " << r << ", op " << reduce_op_name(ops[i]);
            EXPECT_TRUE(out[i][r] == out[i][0]) << "rank " << r << " differs bitwise from rank 0";
          }
        }
      }
    }
  }
}

TEST(Collectives, ReduceScatterMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      for (int64_t recv_count : counts_for(ranks, dtype, kLarge / ranks)) {
        SCOPED_TRACE(label(ranks, dtype, recv_count));
        const Inputs in = make_inputs(ranks, [&](int) { return recv_count * ranks; }, dtype, 2);
        const std::vector<ReduceOp> ops = ops_for(recv_count, kLarge / ranks, dtype);
        std::vector<std::vector<std::vector<std::byte>>> out(ops.size(), std::vector<std::vector<std::byte>>(ranks));
        launch(threads(ranks), [&](Communicator& world) {
          for (size_t i = 0; i < ops.size(); ++i) {
            std::vector<std::byte> recv(recv_count * dtype_size(dtype));
            world.reduce_scatter(in.bytes[world.rank()].data(), recv.data(), recv_count, dtype, ops[i]);
            out[i][world.rank()] = std::move(recv);
          }
        });
        const std::vector<double> abs_sum = ref::abs_sum(in.values);
        for (size_t i = 0; i < ops.size(); ++i) {
          const ref::Buffers want = ref::reduce_scatter(in.values, recv_count, ops[i]);
          for (int r = 0; r < ranks; ++r) {
            const std::vector<double> block_abs(abs_sum.begin() + r * recv_count, abs_sum.begin() + (r + 1) * recv_count);
            EXPECT_EQ(compare_reduced(decode(out[i][r], dtype), want[r], block_abs, dtype, ops[i], ranks), "")
                << "rank " << r << ", op " << reduce_op_name(ops[i]);
          }
        }
      }
    }
  }
}

TEST(Collectives, AllGatherMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::I64}) {
      for (int64_t send_count : counts_for(ranks, dtype, kLarge / ranks)) {
        SCOPED_TRACE(label(ranks, dtype, send_count));
        const Inputs in = make_inputs(ranks, [&](int) { return send_count; }, dtype, 3);
        std::vector<std::vector<std::byte>> out(ranks), in_place(ranks);
        const size_t element = dtype_size(dtype);
        launch(threads(ranks), [&](Communicator& world) {
          const int r = world.rank();
          std::vector<std::byte> recv(send_count * ranks * element);
          world.all_gather(in.bytes[r].data(), recv.data(), send_count, dtype);
          out[r] = std::move(recv);
          // In place: the send is this rank's own block of recv.
          std::vector<std::byte> both(send_count * ranks * element);
          std::copy(in.bytes[r].begin(), in.bytes[r].end(), both.begin() + r * send_count * element);
          world.all_gather(both.data() + r * send_count * element, both.data(), send_count, dtype);
          in_place[r] = std::move(both);
        });
        const std::vector<double> want = ref::all_gather(in.values);
        for (int r = 0; r < ranks; ++r) {
          EXPECT_EQ(compare_exact(decode(out[r], dtype), want), "") << "rank " << r;
          EXPECT_EQ(compare_exact(decode(in_place[r], dtype), want), "") << "rank " << r << " in place";
        }
      }
    }
  }
}

TEST(Collectives, AllGatherVWithZeroCountsMatchesReference) {
  for (int ranks : kRankCounts) {
    std::vector<std::vector<int64_t>> layouts = {
        std::vector<int64_t>(ranks, 0),  // nobody sends
    };
    std::vector<int64_t> uneven(ranks);
    for (int r = 0; r < ranks; ++r) uneven[r] = r % 3 == 1 ? 0 : 1009 + 17 * r;
    layouts.push_back(uneven);
    std::vector<int64_t> large(ranks);
    for (int r = 0; r < ranks; ++r) large[r] = r % 3 == 1 ? 0 : kLarge / ranks + 101 * r;
    for (DType dtype : kDtypes) {
      std::vector<std::vector<int64_t>> these = layouts;
      if (has_large(ranks, dtype)) these.push_back(large);
      for (const auto& counts : these) {
        SCOPED_TRACE(label(ranks, dtype, counts.back()));
        const Inputs in = make_inputs(ranks, [&](int r) { return counts[r]; }, dtype, 4);
        const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
        std::vector<std::vector<std::byte>> out(ranks);
        launch(threads(ranks), [&](Communicator& world) {
          std::vector<std::byte> recv(total * dtype_size(dtype));
          world.all_gather_v(in.bytes[world.rank()].data(), recv.data(), counts, dtype);
          out[world.rank()] = std::move(recv);
        });
        const std::vector<double> want = ref::all_gather(in.values);
        for (int r = 0; r < ranks; ++r) EXPECT_EQ(compare_exact(decode(out[r], dtype), want), "") << "rank " << r;
      }
    }
  }
}

TEST(Collectives, BroadcastMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      for (int64_t count : counts_for(ranks, dtype, kLarge)) {
        for (int root : {0, ranks - 1}) {
          SCOPED_TRACE(label(ranks, dtype, count) + ", root " + std::to_string(root));
          // Only the root's input matters; the others start from zeros.
          const Inputs in = make_inputs(ranks, [&](int r) { return r == root ? count : 0; }, dtype, 5);
          std::vector<std::vector<std::byte>> out(ranks);
          launch(threads(ranks), [&](Communicator& world) {
            std::vector<std::byte> data = in.bytes[world.rank()];
            data.resize(count * dtype_size(dtype));
            world.broadcast(data.data(), count, dtype, root);
            out[world.rank()] = std::move(data);
          });
          const std::vector<double> want = ref::broadcast(in.values, root);
          for (int r = 0; r < ranks; ++r) EXPECT_EQ(compare_exact(decode(out[r], dtype), want), "") << "rank " << r;
        }
      }
    }
  }
}

TEST(Collectives, ReduceMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      for (int64_t count : counts_for(ranks, dtype, kLarge)) {
        SCOPED_TRACE(label(ranks, dtype, count));
        const int root = ranks / 2;
        const Inputs in = make_inputs(ranks, [&](int) { return count; }, dtype, 6);
        const std::vector<ReduceOp> ops = ops_for(count, kLarge, dtype);
        std::vector<std::vector<std::byte>> out(ops.size());
        launch(threads(ranks), [&](Communicator& world) {
          for (size_t i = 0; i < ops.size(); ++i) {
            // Only the root has a result buffer; the others pass null, as the interface allows.
            std::vector<std::byte> recv(world.rank() == root ? count * dtype_size(dtype) : 0);
            world.reduce(in.bytes[world.rank()].data(), world.rank() == root ? recv.data() : nullptr, count, dtype,
                         ops[i], root);
            if (world.rank() == root) out[i] = std::move(recv);
          }
        });
        const std::vector<double> abs_sum = ref::abs_sum(in.values);
        for (size_t i = 0; i < ops.size(); ++i) {
          EXPECT_EQ(compare_reduced(decode(out[i], dtype), ref::reduce(in.values, ops[i]), abs_sum, dtype, ops[i], ranks),
                    "")
              << "op " << reduce_op_name(ops[i]);
        }
      }
    }
  }
}

TEST(Collectives, ReduceInPlaceOnTheRoot) {
  const int ranks = 4, root = 1;
  for (int64_t count : {int64_t{1009}, kLarge}) {
    SCOPED_TRACE(count);
    const Inputs in = make_inputs(ranks, [&](int) { return count; }, DType::F32, 7);
    std::vector<std::byte> result;
    launch(threads(ranks), [&](Communicator& world) {
      std::vector<std::byte> data = in.bytes[world.rank()];
      world.reduce(data.data(), world.rank() == root ? data.data() : nullptr, count, DType::F32, ReduceOp::Sum, root);
      if (world.rank() == root) result = std::move(data);
    });
    EXPECT_EQ(compare_reduced(decode(result, DType::F32), ref::reduce(in.values, ReduceOp::Sum),
                              ref::abs_sum(in.values), DType::F32, ReduceOp::Sum, ranks),
              "");
  }
}

TEST(Collectives, AllToAllMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      for (int64_t count : counts_for(ranks, dtype, kLarge / ranks)) {
        SCOPED_TRACE(label(ranks, dtype, count));
        const Inputs in = make_inputs(ranks, [&](int) { return count * ranks; }, dtype, 8);
        std::vector<std::vector<std::byte>> out(ranks);
        launch(threads(ranks), [&](Communicator& world) {
          std::vector<std::byte> recv(count * ranks * dtype_size(dtype));
          world.all_to_all(in.bytes[world.rank()].data(), recv.data(), count, dtype);
          out[world.rank()] = std::move(recv);
        });
        const ref::Buffers want = ref::all_to_all(in.values, count);
        for (int r = 0; r < ranks; ++r) EXPECT_EQ(compare_exact(decode(out[r], dtype), want[r]), "") << "rank " << r;
      }
    }
  }
}

TEST(Collectives, AllToAllVWithZeroCountsMatchesReference) {
  for (int ranks : kRankCounts) {
    for (DType dtype : kDtypes) {
      std::vector<int64_t> bases = {37};
      if (has_large(ranks, dtype)) bases.push_back(kLarge / (ranks * ranks));
      for (int64_t base : bases) {
        SCOPED_TRACE(label(ranks, dtype, base));
        // send[q][r]: what q sends to r; some pairs exchange nothing.
        std::vector<std::vector<int64_t>> send(ranks, std::vector<int64_t>(ranks));
        for (int q = 0; q < ranks; ++q) {
          for (int r = 0; r < ranks; ++r) send[q][r] = (q + 2 * r) % 4 == 0 ? 0 : base + 7 * q + 3 * r;
        }
        const Inputs in = make_inputs(
            ranks, [&](int q) { return std::accumulate(send[q].begin(), send[q].end(), int64_t{0}); }, dtype, 9);
        std::vector<std::vector<std::byte>> out(ranks);
        launch(threads(ranks), [&](Communicator& world) {
          const int r = world.rank();
          std::vector<int64_t> recv_counts(ranks);
          for (int q = 0; q < ranks; ++q) recv_counts[q] = send[q][r];
          std::vector<std::byte> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), int64_t{0}) *
                                      dtype_size(dtype));
          world.all_to_all_v(in.bytes[r].data(), send[r], recv.data(), recv_counts, dtype);
          out[r] = std::move(recv);
        });
        const ref::Buffers want = ref::all_to_all_v(in.values, send);
        for (int r = 0; r < ranks; ++r) EXPECT_EQ(compare_exact(decode(out[r], dtype), want[r]), "") << "rank " << r;
      }
    }
  }
}

TEST(Collectives, BarrierHoldsEveryRankUntilAllArrive) {
  for (int ranks : kRankCounts) {
    constexpr int kRounds = 50;
    std::vector<std::atomic<int>> arrived(kRounds);
    std::atomic<int> early{0};
    launch(threads(ranks), [&](Communicator& world) {
      for (int round = 0; round < kRounds; ++round) {
        arrived[round].fetch_add(1);
        world.barrier();
        if (arrived[round].load() != ranks) early.fetch_add(1);
      }
    });
    EXPECT_EQ(early.load(), 0) << ranks << " ranks";
  }
}

// bf16/f16 reductions accumulate in f32 and round once: 1 + 7 small terms that a pairwise bf16
// (or f16) sum would each round away must still move the result.
TEST(Collectives, HalfPrecisionReductionsRoundOnce) {
  struct Case {
    DType dtype;
    double small, expected;
  };
  // bf16: ulp(1) = 2^-7; 1 + 7 * 2^-9 = 1.013671875 -> 1.015625. f16: ulp(1) = 2^-10;
  // 1 + 7 * 2^-12 -> 1 + 2^-9. Pairwise, 1 + small rounds back to 1 every time.
  for (const Case& c : {Case{DType::BF16, 0x1p-9, 1.015625}, Case{DType::F16, 0x1p-12, 1.0 + 0x1p-9}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    std::vector<std::byte> result;
    launch(threads(8), [&](Communicator& world) {
      std::vector<std::byte> data = encode({world.rank() == 0 ? 1.0 : c.small}, c.dtype);
      world.all_reduce(data.data(), 1, c.dtype, ReduceOp::Sum);
      if (world.rank() == 0) result = std::move(data);
    });
    EXPECT_EQ(decode(result, c.dtype)[0], c.expected);
  }
}

// The tp, dp and pp groups of a 2x2x2 mesh (tp fastest, pp slowest) each run a different
// collective at the same time; every result is checked against the reference over the group.
TEST(Collectives, MeshGroupsRunConcurrently) {
  const int ranks = 8;
  const int64_t count = 20011;  // a prime, read in place for f32
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(dtype_name(dtype));
    const Inputs in = make_inputs(ranks, [&](int) { return count * 2; }, dtype, 10);
    std::vector<std::vector<std::byte>> tp_out(ranks), dp_out(ranks), pp_out(ranks);
    launch(threads(ranks), [&](Communicator& world) {
      const int r = world.rank();
      auto tp = world.split(r / 2, r, "tp-" + std::to_string(r / 2));
      auto dp = world.split((r % 2) + 2 * (r / 4), r, "dp-" + std::to_string((r % 2) + 2 * (r / 4)));
      auto pp = world.split(r % 4, r, "pp-" + std::to_string(r % 4));
      const size_t element = dtype_size(dtype);
      std::vector<std::byte> tp_data(in.bytes[r].begin(), in.bytes[r].begin() + count * element);
      std::vector<std::byte> dp_recv(count * 2 * element), pp_recv(count * element);
      auto a = tp->all_reduce_async(tp_data.data(), count, dtype, ReduceOp::Sum);
      auto b = dp->all_gather_async(in.bytes[r].data(), dp_recv.data(), count, dtype);
      auto c = pp->reduce_scatter_async(in.bytes[r].data(), pp_recv.data(), count, dtype, ReduceOp::Avg);
      c->wait();
      b->wait();
      a->wait();
      tp_out[r] = std::move(tp_data);
      dp_out[r] = std::move(dp_recv);
      pp_out[r] = std::move(pp_recv);
    });
    auto first_half = [&](int r) {
      return std::vector<double>(in.values[r].begin(), in.values[r].begin() + count);
    };
    for (int r = 0; r < ranks; ++r) {
      const int tp_peer = r ^ 1, dp_peer = r ^ 2, pp_peer = r ^ 4;
      const ref::Buffers tp_in = r < tp_peer ? ref::Buffers{first_half(r), first_half(tp_peer)}
                                             : ref::Buffers{first_half(tp_peer), first_half(r)};
      EXPECT_EQ(compare_reduced(decode(tp_out[r], dtype), ref::all_reduce(tp_in, ReduceOp::Sum), ref::abs_sum(tp_in),
                                dtype, ReduceOp::Sum, 2),
                "")
          << "tp, rank " << r;
      const ref::Buffers dp_in = r < dp_peer ? ref::Buffers{first_half(r), first_half(dp_peer)}
                                             : ref::Buffers{first_half(dp_peer), first_half(r)};
      EXPECT_EQ(compare_exact(decode(dp_out[r], dtype), ref::all_gather(dp_in)), "") << "dp, rank " << r;
      const ref::Buffers pp_in = r < pp_peer ? ref::Buffers{in.values[r], in.values[pp_peer]}
                                             : ref::Buffers{in.values[pp_peer], in.values[r]};
      const int pp_rank = r < pp_peer ? 0 : 1;
      const std::vector<double> abs_sum = ref::abs_sum(pp_in);
      EXPECT_EQ(compare_reduced(decode(pp_out[r], dtype), ref::reduce_scatter(pp_in, count, ReduceOp::Avg)[pp_rank],
                                std::vector<double>(abs_sum.begin() + pp_rank * count,
                                                    abs_sum.begin() + (pp_rank + 1) * count),
                                dtype, ReduceOp::Avg, 2),
                "")
          << "pp, rank " << r;
    }
  }
}

}  // namespace
}  // namespace loom::comm
