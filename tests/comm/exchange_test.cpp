// Communicator::exchange_async (a batch of sends and recvs, Megatron's batch_isend_irecv) against
// a serial reference: rings of 2, 3 and 4 ranks on the threads backend, every rank sending four
// messages of mixed dtypes (f32, i64, an empty one, bf16) to the next rank, one back to the
// previous one and one to itself, the batch listing its sends first, its recvs first, or mixed.
// The same batches under NCCL's semantics (tests/support/rendezvous_comm.h: one operation at a
// time, a send waits for the peer's recv, no tags) complete too, while the unbatched pattern
// the pipeline and ring attention used before (every rank sends, then receives) deadlocks there
// and ends in the timeout naming the recv that was never posted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "support/rendezvous_comm.h"

namespace loom::comm {
namespace {

enum class Order { SendsFirst, RecvsFirst, Mixed };

LaunchOptions threads(int ranks, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  LaunchOptions options;
  options.backend = "threads";
  options.ranks = ranks;
  options.comm.timeout = timeout;
  return options;
}

// One message of the test: from `source` with `tag`, its bytes a function of both.
struct Message {
  DType dtype;
  int64_t count;
  int tag;
};
// Sent to the next rank (tags 1..4), to the previous one (5) and to itself (6). Counts depend on
// the sender, so a message matched with the wrong recv shows.
std::vector<Message> to_next(int source) {
  return {{DType::F32, 1000 + source, 1}, {DType::I64, 3, 2}, {DType::F32, 0, 3}, {DType::BF16, 17 + source, 4}};
}
Message to_previous(int source) { return {DType::F32, 5 + source, 5}; }
Message to_self(int source) { return {DType::I32, 4 + source, 6}; }

std::vector<std::byte> payload(int source, const Message& m) {
  std::vector<std::byte> bytes(static_cast<size_t>(m.count) * dtype_size(m.dtype));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(static_cast<uint8_t>(source * 31 + m.tag * 7 + i));
  return bytes;
}

// Rank r's batch: every send and recv of the ring, in `order`; each recv's bytes must equal the
// serial reference's (what its sender's payload is).
void ring_exchange(Communicator& c, Order order, bool with_self) {
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, previous = (r + n - 1) % n;
  std::vector<std::pair<int, Message>> outs, ins;  // (peer, message), in each pair's issue order
  for (const Message& m : to_next(r)) outs.push_back({next, m});
  outs.push_back({previous, to_previous(r)});
  for (const Message& m : to_next(previous)) ins.push_back({previous, m});
  ins.push_back({next, to_previous(next)});
  if (with_self) {
    outs.push_back({r, to_self(r)});
    ins.push_back({r, to_self(r)});
  }
  std::vector<std::vector<std::byte>> sent, received, expected;
  for (size_t k = 0; k < outs.size(); ++k) {
    sent.push_back(payload(r, outs[k].second));
    expected.push_back(payload(ins[k].first, ins[k].second));  // the peer is the sender
    received.emplace_back(expected.back().size(), std::byte{0xAB});
  }
  std::vector<PeerOp> sends, recvs;
  for (size_t k = 0; k < outs.size(); ++k) {
    const Message& o = outs[k].second;
    sends.push_back(PeerOp::send(sent[k].data(), o.count, o.dtype, outs[k].first, o.tag));
    const Message& i = ins[k].second;
    recvs.push_back(PeerOp::recv(received[k].data(), i.count, i.dtype, ins[k].first, i.tag));
  }
  std::vector<PeerOp> batch;
  if (order == Order::RecvsFirst) std::swap(sends, recvs);
  if (order == Order::Mixed) {
    for (size_t k = 0; k < sends.size(); ++k) {
      batch.push_back(k % 2 == 0 ? recvs[k] : sends[k]);
      batch.push_back(k % 2 == 0 ? sends[k] : recvs[k]);
    }
  } else {
    batch = sends;
    batch.insert(batch.end(), recvs.begin(), recvs.end());
  }
  all_of(c.exchange_async(batch))->wait();
  for (size_t k = 0; k < received.size(); ++k) EXPECT_EQ(received[k], expected[k]) << "rank " << r << " recv " << k;
}

TEST(Exchange, RingsWhoseRanksSendFirstMatchTheSerialReference) {
  for (int ranks : {2, 3, 4}) {
    for (Order order : {Order::SendsFirst, Order::RecvsFirst, Order::Mixed}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, order " + std::to_string(static_cast<int>(order)));
      launch(threads(ranks), [&](Communicator& world) { ring_exchange(world, order, true); });
    }
  }
}

TEST(Exchange, TagsMatchMessagesWhateverTheirOrderInTheBatch) {
  launch(threads(2), [](Communicator& c) {
    const int peer = 1 - c.rank();
    std::vector<float> a(10, float(c.rank() + 1)), b(20, float(c.rank() + 5)), got_a(10), got_b(20);
    // Rank 0 lists tag 1 then 2; rank 1 receives tag 2 first.
    std::vector<PeerOp> ops = {PeerOp::send(a.data(), 10, DType::F32, peer, 1), PeerOp::send(b.data(), 20, DType::F32, peer, 2),
                               PeerOp::recv(got_a.data(), 10, DType::F32, peer, 1), PeerOp::recv(got_b.data(), 20, DType::F32, peer, 2)};
    if (c.rank() == 1) std::reverse(ops.begin(), ops.end());
    all_of(c.exchange_async(ops))->wait();
    EXPECT_EQ(got_a, std::vector<float>(10, float(peer + 1)));
    EXPECT_EQ(got_b, std::vector<float>(20, float(peer + 5)));
  });
}

// Under NCCL's semantics the messages between two ranks match in issue order, so each rank lists
// its recvs from a peer in the order the peer lists its sends (the ring's batches above do).
TEST(Exchange, RingBatchesCompleteWithRendezvousSends) {
  for (int ranks : {2, 3, 4}) {
    for (Order order : {Order::SendsFirst, Order::RecvsFirst, Order::Mixed}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks, order " + std::to_string(static_cast<int>(order)));
      launch(threads(ranks), [&](Communicator& world) {
        testing::RendezvousCommunicator nccl_like(world.split(0, world.rank(), "rendezvous"));
        ring_exchange(nccl_like, order, true);
      });
    }
  }
}

// What the pipeline's stages and ring attention's hops did before: every rank sends to the next,
// then receives from the previous. The threads backend queues sends, so that completes; with
// rendezvous sends every rank waits in its send for a recv that comes after it.
TEST(Exchange, SendingBeforeReceivingDeadlocksWithRendezvousSends) {
  // The buffers outlive the communicator: a rank that gave up still runs its queued recv when the
  // rendezvous communicator is destroyed, and the recv may still land.
  auto unbatched = [](Communicator& c, std::vector<float>& out, std::vector<float>& in) {
    const int next = (c.rank() + 1) % c.size(), previous = (c.rank() + c.size() - 1) % c.size();
    WorkHandle send = c.send_async(out.data(), 1000, DType::F32, next, 0);
    WorkHandle recv = c.recv_async(in.data(), 1000, DType::F32, previous, 0);
    send->wait();
    recv->wait();
  };
  launch(threads(2), [&](Communicator& world) {
    std::vector<float> out(1000, 1.0f), in(1000);
    unbatched(world, out, in);
  });
  std::string error;
  try {
    launch(threads(2, std::chrono::milliseconds(300)), [&](Communicator& world) {
      std::vector<float> out(1000, 1.0f), in(1000);
      testing::RendezvousCommunicator nccl_like(world.split(0, world.rank(), "rendezvous"));
      unbatched(nccl_like, out, in);
    });
  } catch (const Error& e) {
    error = e.what();
  }
  // The rank whose send timed out names the recv that never came; when that rank's error is
  // reported after its peer's, the peer names the send it left without.
  const bool send_timed_out =
      error.find("timed out") != std::string::npos && error.find("never posted the matching recv") != std::string::npos;
  const bool peer_left = error.find("without posting the matching send") != std::string::npos;
  EXPECT_TRUE(send_timed_out || peer_left) << error;
}

}  // namespace
}  // namespace loom::comm
