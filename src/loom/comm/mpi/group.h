#pragma once
// Internals of the mpi backend: one Group per MPI communicator and the collective operations
// queued on it (operation.h). The Communicator that fronts a group is in communicator.h.
//
// How a collective runs. Every collective takes the same path; it only describes its arguments
// (a CollectiveCall) and the MPI call that moves its data (a Transfer, transfer.h).
// MpiCommunicator::issue checks the arguments (arguments.h) and hands the operation to
// Group::issue, which assigns the next sequence number of the group, publishes it in the arrival
// counters (arrival.h) and queues it (issue.cpp). Operations of a group execute one at a time in
// issue order, either inline on a caller that waits for one not yet started (every blocking
// collective: no thread hand-off), or on the group's communication thread (progress.cpp), so
// that async operations progress while the caller computes (the thread is woken at issue once
// the group is seen used asynchronously, else by the ticker when an operation is still untouched
// a millisecond after issue). Every execution has two phases:
// 1. Handshake (handshake.cpp): a nonblocking all-reduce of the operation's descriptor, polled
//    with MPI_Test. It proves that every rank has arrived and that all agree on the operation
//    (else every rank throws naming each rank's view, and the group stays usable). A waiter whose
//    deadline passes abandons it and reads the arrival counters to name the ranks that never
//    came; the group is unusable from then on (its later operations fail at once, saying why).
// 2. Transfer: the operation's Transfer, MPI's blocking collective (MPI_Allreduce, ...). Open
//    MPI's blocking collectives are much faster than its nonblocking ones for large messages
//    (about 2x at 64 MiB here, see docs/benchmarks.md), and after the handshake every rank is
//    known to be there.
// With MpiOptions::check_agreement off there is no handshake: the communication thread runs the
// transfer alone (a caller could not bound a blocking MPI call by its deadline), and a waiter
// that times out still names the missing ranks from the counters.
// Send and receive are MPI_Isend / MPI_Irecv polled by the waiter (p2p.cpp).
#include <atomic>
#include <chrono>
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
#include "loom/comm/mpi/operation.h"
#include "loom/comm/mpi/util.h"
#include "loom/core/error.h"

namespace loom::comm::mpi_detail {

// How long the communication thread leaves a newly issued operation to its caller (progress.cpp).
inline constexpr std::chrono::microseconds kClaimGrace{50};
// The ticker's period, and how old an untouched operation must be for it to wake the thread; an
// operation waited for within kPark of its issue counts as used blocking (Group::wait).
inline constexpr std::chrono::microseconds kTick{1000};
inline constexpr std::chrono::microseconds kPark{100};

// The ticker: one thread per process that wakes the communication thread of a group whose
// operation was issued but, a moment later, neither waited for nor started (see Group::issue).
// run_mpi starts it after MPI_Init and stops it before MPI_Finalize; without it every issue wakes
// the communication thread at once.
void start_ticker();
void stop_ticker();
bool ticker_running();
// Adds a group to those the ticker visits (until the group is gone).
void watch_group(std::weak_ptr<Group> group);

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Collective over `comm`, which the group takes over (a dup or split of its own). group.cpp.
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
  // "mpi group 'tp-0' (2 ranks)".
  std::string label() const;

  // The one way in for collectives (issue.cpp): queues `op` and returns its handle, whose wait()
  // and test() come back to wait() and test() below.
  WorkHandle issue(std::shared_ptr<CollectiveOp> op);
  void wait(const std::shared_ptr<CollectiveOp>& op);
  bool test(const std::shared_ptr<CollectiveOp>& op);
  // A send or receive (p2p.cpp).
  WorkHandle issue_p2p(bool is_send, void* data, int64_t count, DType dtype, int peer, int tag);

  // The ticker's visit: wakes the communication thread for an operation left untouched.
  void tick(Clock::time_point now);

  // For the transfers, on the executing thread: the communicator of the collectives (handshakes
  // and transfers, in issue order), and a buffer of at least `bytes` that only that thread uses.
  MPI_Comm comm() const { return comm_; }
  void* scratch(size_t bytes);
  // For P2pWork: data and headers of send/recv.
  MPI_Comm p2p_comm() const { return p2p_; }
  MPI_Comm header_comm() const { return header_; }

 private:
  Group() = default;
  enum class Poll { Done, Abandoned, TimedOut };

  // Communication thread (progress.cpp).
  void worker_loop();
  void start_worker_locked();
  std::shared_ptr<CollectiveOp> claim_locked();
  void release_locked();
  void wake_worker_locked();
  void wake_waiters_locked();
  // Closing (group.cpp): runs what is queued; then stops the thread, false if it stayed in MPI.
  void drain_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline);
  bool stop_worker_locked(std::unique_lock<std::mutex>& lock, bool unwinding);
  // Execution (issue.cpp): runs `op` (claimed by this thread). False when its handshake missed
  // `deadline`.
  bool execute(const std::shared_ptr<CollectiveOp>& op, std::optional<Clock::time_point> deadline);
  void complete(const std::shared_ptr<CollectiveOp>& op, std::exception_ptr error);
  void fail_locked(CollectiveOp& op, const std::string& message);
  // Builds the timeout error for `waited`, marks the group unusable and fails what is queued.
  Error timeout_locked(const std::shared_ptr<CollectiveOp>& waited, const std::shared_ptr<CollectiveOp>& blocking,
                       Clock::time_point started);
  std::string missing_ranks(int64_t seq);
  // When every rank entered `seq`: the ranks whose handshake polls stood still since `before`.
  std::string stalled_ranks(int64_t seq, const std::vector<ArrivalCounters::Reading>& before);
  std::string unusable_message() const;
  // Handshake (handshake.cpp).
  Poll handshake(CollectiveOp& op, std::optional<Clock::time_point> deadline);
  Poll disagreement(CollectiveOp& op, std::optional<Clock::time_point> deadline);
  Poll check_pair_counts(CollectiveOp& op, std::optional<Clock::time_point> deadline);
  Poll poll(CollectiveOp& op, std::optional<Clock::time_point> deadline, const char* what);

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
};

// The transfer of split(): MPI_Comm_split of the group's communicator; the new group (with the
// parent's options) for this rank, or null when its color is negative. group.cpp.
std::unique_ptr<Communicator> split_group(Group& group, const CollectiveOp& op);

}  // namespace loom::comm::mpi_detail
