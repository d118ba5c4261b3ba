#pragma once
// Communicator: one process group as seen by one of its ranks. Every parallelism in loom talks
// through this interface; the backends (threads, mpi, later nccl) implement it.
//
// Semantics every backend keeps:
// - Collectives are called by every rank of the group, in the same order. Operations on one
//   group complete in issue order; the *_async forms return a handle so computation can overlap.
// - bf16/f16 reductions accumulate in f32 and round once at the end.
// - Every wait has a timeout (CommOptions::timeout). On timeout the Error names the group, the
//   operation, its sequence number on this group and the ranks that never arrived.
// - Ranks that disagree on an operation's kind, element count or dtype get an Error naming the
//   group, the operation and each rank's view, never garbage or a hang.
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/core/dtype.h"

namespace loom::comm {

enum class ReduceOp : uint8_t { Sum, Avg, Max };
std::string reduce_op_name(ReduceOp op);

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

// A pending operation. wait() blocks until it completes (or throws loom::Error on timeout or
// failure); test() polls. Waiting twice is allowed.
//
// wait_in_stream(): the operation's result is ready for everything the calling thread does next
// on the device and in host memory. Where the backend can order that on the device (nccl: the
// calling thread's compute stream waits for the operation's completion event), the host does not
// block, so it keeps queueing kernels while the operation runs; the backend then keeps
// CommOptions::timeout itself (nccl: a watchdog, comm/watchdog.h). Every other backend waits as
// wait() does. For results the compute stream consumes; what the host must see done (a barrier,
// a wait that is timed, a buffer another thread's stream reads) takes wait().
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
  virtual void wait_in_stream() { wait(); }
};
using WorkHandle = std::shared_ptr<Work>;

// One handle on several operations: done when all are (wait() and wait_in_stream() take each in turn).
WorkHandle all_of(std::vector<WorkHandle> parts);

// One send or receive of a batch (Communicator::exchange_async).
struct PeerOp {
  enum class Kind : uint8_t { Send, Recv };
  Kind kind = Kind::Send;
  void* data = nullptr;  // read by a send, written by a recv
  int64_t count = 0;
  DType dtype = DType::F32;
  int peer = 0;
  int tag = 0;

  static PeerOp send(const void* data, int64_t count, DType dtype, int peer, int tag) {
    return {Kind::Send, const_cast<void*>(data), count, dtype, peer, tag};
  }
  static PeerOp recv(void* data, int64_t count, DType dtype, int peer, int tag) {
    return {Kind::Recv, data, count, dtype, peer, tag};
  }
  bool is_send() const { return kind == Kind::Send; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // within this group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;      // e.g. "world", "tp-0", "dp-3"
  virtual const std::vector<int>& world_ranks() const = 0;  // world rank of each member
  virtual std::string backend() const = 0;          // "threads" | "mpi" | ...

  // In place over `count` elements.
  virtual WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) = 0;
  // send holds size() * recv_count elements; rank r receives the reduction of block r.
  virtual WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                          ReduceOp op) = 0;
  // recv holds size() * send_count elements, rank r's block at r * send_count.
  virtual WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) = 0;
  // Uneven: rank r contributes counts[r] elements; recv holds their concatenation in rank order.
  virtual WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                        DType dtype) = 0;
  virtual WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) = 0;
  // recv is written on `root` only (may be null elsewhere).
  virtual WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                  int root) = 0;
  // send and recv hold size() * count elements; block r of send goes to rank r.
  virtual WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) = 0;
  // send_counts[r] elements go to rank r (consecutive blocks of send); recv_counts[r] come from r.
  virtual WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                        std::span<const int64_t> recv_counts, DType dtype) = 0;
  virtual WorkHandle barrier_async() = 0;
  // Point to point with tags; a send matches the recv of the same (source, destination, tag),
  // in issue order. Counts and dtypes must agree (checked).
  virtual WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  virtual WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) = 0;
  // A batch of sends and receives (Megatron's batch_isend_irecv): one handle per op, in order.
  // The batch's operations progress together, so no order of sends and recvs in the batch, or in
  // the peers' batches, waits on itself: two ranks that both send before they receive, a ring
  // whose every rank sends to the next and receives from the previous. Messages match as
  // send_async's do; where a backend has no tags (nccl), those between one pair of ranks match in
  // issue order. Each buffer stays valid until its handle completes. The default posts each op
  // with send_async / recv_async, so a recv's handle completes with its data, whatever this rank's
  // sends: right where a send does not wait for its peer's recv (threads, mpi). nccl overrides it
  // with one group, every handle completing with the whole batch.
  virtual std::vector<WorkHandle> exchange_async(std::span<const PeerOp> ops);

  // Collective over this group: ranks passing the same `color` form a new group, ordered by
  // `key` (ties by rank). color < 0 returns nullptr (the rank joins no group).
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // Blocking forms: each returns when its result is ready for the calling thread's later work
  // (Work::wait_in_stream: on nccl the compute stream waits, not the host); a barrier returns when
  // every rank has reached it.
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
    all_reduce_async(data, count, dtype, op)->wait_in_stream();
  }
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op) {
    reduce_scatter_async(send, recv, recv_count, dtype, op)->wait_in_stream();
  }
  void all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
    all_gather_async(send, recv, send_count, dtype)->wait_in_stream();
  }
  void all_gather_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype) {
    all_gather_v_async(send, recv, counts, dtype)->wait_in_stream();
  }
  void broadcast(void* data, int64_t count, DType dtype, int root) {
    broadcast_async(data, count, dtype, root)->wait_in_stream();
  }
  void reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) {
    reduce_async(send, recv, count, dtype, op, root)->wait_in_stream();
  }
  void all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
    all_to_all_async(send, recv, count, dtype)->wait_in_stream();
  }
  void all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                    std::span<const int64_t> recv_counts, DType dtype) {
    all_to_all_v_async(send, send_counts, recv, recv_counts, dtype)->wait_in_stream();
  }
  void barrier() { barrier_async()->wait(); }
  void send(const void* data, int64_t count, DType dtype, int peer, int tag) {
    send_async(data, count, dtype, peer, tag)->wait_in_stream();
  }
  void recv(void* data, int64_t count, DType dtype, int peer, int tag) {
    recv_async(data, count, dtype, peer, tag)->wait_in_stream();
  }
};

}  // namespace loom::comm
