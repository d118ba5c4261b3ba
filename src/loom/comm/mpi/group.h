#pragma once
// Internals of the mpi backend: one Group per MPI communicator, the collective operations queued
// on it, and the Communicator that fronts it.
//
// How a collective runs. Issuing it (all_reduce_async, ...) assigns the next sequence number of
// the group, publishes it in the arrival counters (mpi/arrival.h) and queues the operation.
// Operations of a group execute one at a time in issue order, either inline on a caller that
// waits for one not yet started (every blocking collective: no thread hand-off), or on the
// group's communication thread, so that async operations progress while the caller computes
// (the thread is woken at issue once the group is seen used asynchronously, else by the ticker
// when an operation is still untouched a millisecond after issue). Every execution has two
// phases:
// 1. Handshake: a nonblocking all-reduce of the operation's descriptor, polled with MPI_Test. It
//    proves that every rank has arrived and that all agree on the operation (else every rank
//    throws naming each rank's view, and the group stays usable). A waiter whose deadline passes
//    abandons it and reads the arrival counters to name the ranks that never came; the group is
//    unusable from then on (its later operations fail at once, saying why).
// 2. Transfer: MPI's blocking collective (MPI_Allreduce, ...). Open MPI's blocking collectives
//    are much faster than its nonblocking ones for large messages (about 2x at 64 MiB here, see
//    docs/benchmarks.md), and after the handshake every rank is known to be there.
// With MpiOptions::check_agreement off there is no handshake: the communication thread runs the
// transfer alone (a caller could not bound a blocking MPI call by its deadline), and a waiter
// that times out still names the missing ranks from the counters.
// Send and receive are MPI_Isend / MPI_Irecv polled by the waiter (see P2pWork).
#include <array>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/mpi/arrival.h"
#include "loom/comm/mpi/backend.h"
#include "loom/comm/mpi/util.h"
#include "loom/core/error.h"

namespace loom::comm::mpi_detail {

enum class OpKind : int64_t {
  AllReduce = 1,
  ReduceScatter,
  AllGather,
  AllGatherV,
  Broadcast,
  Reduce,
  AllToAll,
  AllToAllV,
  Barrier,
  Split,
};
std::string op_kind_name(OpKind kind);

// The fields every rank must agree on, all-reduced as max(x) and max(-x) (= -min) in one call.
enum DescriptorField : int { kKind, kDType, kCount, kReduce, kRoot, kCountsHash, kInvalid, kFields };
using Descriptor = std::array<int64_t, kFields>;
std::string describe_descriptor(const Descriptor& d);

struct CollectiveOp {
  OpKind kind = OpKind::Barrier;
  DType dtype = DType::F32;
  ReduceOp reduce = ReduceOp::Sum;
  int root = -1;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;                 // the per-call count of the interface's signature
  std::vector<int64_t> counts;       // all_gather_v: per rank; all_to_all_v: send counts
  std::vector<int64_t> recv_counts;  // all_to_all_v
  int color = 0;                     // split
  int key = 0;
  std::string split_name;
  std::unique_ptr<Communicator> split_result;
  std::string invalid;  // this rank's argument error; empty when the arguments are valid

  // Settings captured at issue, so that set_mpi_options() affects later operations only.
  bool check_agreement = true;
  int64_t max_elements = INT_MAX;

  int64_t seq = 0;  // 1-based position among this group's collectives
  Clock::time_point issued{};
  enum class Phase { Queued, Handshake, Transfer, Done, Failed };
  Phase phase = Phase::Queued;  // guarded by the group's mutex
  std::exception_ptr error;     // with Phase::Failed
  std::atomic<bool> abandoned{false};

  // Handshake buffers. MPI may still write them after an abandoned handshake, so an abandoned
  // operation is kept alive for the rest of the process (see keep_alive()).
  Descriptor descriptor{};
  std::array<int64_t, 2 * kFields> agreement{};
  std::vector<int64_t> views;          // every rank's descriptor, gathered on disagreement
  std::vector<int64_t> peer_sends;     // all_to_all_v: what each peer will send this rank
  std::array<int64_t, 4> pair_report{};  // all_to_all_v: (bad, peer, expected, announced)
  std::vector<int64_t> pair_reports;
  MPI_Request pending = MPI_REQUEST_NULL;

  // "all_reduce #7 (f32 x 1024, sum)".
  std::string describe() const;
};

// The ticker: one thread per process that wakes the communication thread of a group whose
// operation was issued but, a moment later, neither waited for nor started (see Group::issue).
// run_mpi starts it after MPI_Init and stops it before MPI_Finalize; without it every issue wakes
// the communication thread at once.
void start_ticker();
void stop_ticker();

// Keeps `object` alive until the process exits: for buffers MPI may still write after the
// operation that owned them was abandoned.
void keep_alive(std::shared_ptr<void> object);
// True once a communication thread had to be left blocked inside MPI (see Group::close).
bool communication_thread_stuck(std::string* what);

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Collective over `comm`, which the group takes over (a dup or split of its own).
  static std::shared_ptr<Group> create(MPI_Comm comm, std::string name, const MpiOptions& options);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // Runs what is still queued (unless an exception unwinds: then the peers may not be here),
  // stops the communication thread and releases the MPI objects without waiting for the peers.
  void close(bool unwinding);

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  MpiOptions options() const;
  void set_options(const MpiOptions& options);
  std::string counters_description() const { return counters_.description(); }

  WorkHandle issue(std::shared_ptr<CollectiveOp> op);
  WorkHandle issue_p2p(bool is_send, void* data, int64_t count, DType dtype, int peer, int tag);

  // The ticker's visit: wakes the communication thread for an operation left untouched.
  void tick(Clock::time_point now);

  // For the Work handles.
  void wait(const std::shared_ptr<CollectiveOp>& op);
  bool test(const std::shared_ptr<CollectiveOp>& op);
  // "mpi group 'tp-0' (2 ranks)".
  std::string label() const;
  MPI_Comm p2p_comm() const { return p2p_; }
  MPI_Comm header_comm() const { return header_; }

 private:
  Group() = default;
  enum class Poll { Done, Abandoned, TimedOut };

  void worker_loop();
  void start_worker_locked();
  std::shared_ptr<CollectiveOp> claim_locked();
  void release_locked();
  void wake_worker_locked();
  void wake_waiters_locked();
  // Runs `op` (claimed by this thread). False when its handshake missed `deadline`.
  bool execute(const std::shared_ptr<CollectiveOp>& op, std::optional<Clock::time_point> deadline);
  Poll handshake(CollectiveOp& op, std::optional<Clock::time_point> deadline);
  Poll poll(CollectiveOp& op, std::optional<Clock::time_point> deadline, const char* what);
  void run_split(CollectiveOp& op);
  void complete(const std::shared_ptr<CollectiveOp>& op, std::exception_ptr error);
  void fail_locked(CollectiveOp& op, const std::string& message);
  // Builds the timeout error for `waited`, marks the group unusable and fails what is queued.
  Error timeout_locked(const std::shared_ptr<CollectiveOp>& waited, const std::shared_ptr<CollectiveOp>& blocking,
                       Clock::time_point started);
  std::string unusable_message() const;
  void* scratch(size_t bytes);

  MPI_Comm comm_ = MPI_COMM_NULL;  // collectives (handshakes and transfers, in issue order)
  MPI_Comm p2p_ = MPI_COMM_NULL;     // send/recv data, so user tags never meet internal traffic
  MPI_Comm header_ = MPI_COMM_NULL;  // send/recv headers (count, dtype), in step with the data
  int rank_ = 0;
  int size_ = 0;
  int tag_ub_ = 32767;  // MPI_TAG_UB; the standard guarantees at least this
  std::string name_;
  std::vector<int> world_ranks_;
  ArrivalCounters counters_;

  mutable std::mutex mutex_;
  // Separate wake-ups for the communication thread (work it may run, shutdown) and for waiters
  // (an operation finished, the executor freed), each signalled only when someone sleeps on it:
  // a blocking collective run inline then costs no thread switch beyond the one wake-up at issue.
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  bool worker_idle_ = false;
  int waiters_ = 0;
  // Wake the communication thread at every issue: set once the group is seen used
  // asynchronously, cleared when a caller runs its own operation right after issuing it.
  bool eager_wake_ = false;
  MpiOptions options_;
  std::deque<std::shared_ptr<CollectiveOp>> queue_;
  std::shared_ptr<CollectiveOp> running_;
  bool executing_ = false;
  int64_t seq_ = 0;
  int64_t p2p_seq_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  bool closed_ = false;
  std::atomic<bool> shutdown_{false};
  std::thread worker_;
  bool worker_exited_ = false;

  // Only the executing thread touches it.
  std::unique_ptr<std::byte[]> scratch_;
  size_t scratch_bytes_ = 0;

  friend void run_transfer(Group& group, CollectiveOp& op);
};

// Phase 2 of every collective but split: MPI's blocking collectives, chunked to
// max_elements_per_call, with bf16/f16 reductions staged through f32 (mpi/transfer.cpp).
void run_transfer(Group& group, CollectiveOp& op);

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<Group> group) : group_(std::move(group)) {}
  ~MpiCommunicator() override;

  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  const std::vector<int>& world_ranks() const override { return group_->world_ranks(); }
  std::string backend() const override { return "mpi"; }

  WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override;
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                  ReduceOp op) override;
  WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override;
  WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                DType dtype) override;
  WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override;
  WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                          int root) override;
  WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override;
  WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                std::span<const int64_t> recv_counts, DType dtype) override;
  WorkHandle barrier_async() override;
  WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override;
  WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  Group& group() { return *group_; }
  const Group& group() const { return *group_; }

 private:
  std::shared_ptr<CollectiveOp> make_op(OpKind kind, DType dtype);
  std::shared_ptr<Group> group_;
};

}  // namespace loom::comm::mpi_detail
