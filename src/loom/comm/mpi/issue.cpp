// The one path of every collective of the mpi backend (see group.h): issue, execution (the
// handshake, then the operation's Transfer), waiting with a deadline and the diagnosis of a
// timeout.
#include <algorithm>
#include <thread>
#include <vector>

#include "loom/comm/activity.h"
#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

namespace {

// How long a timed-out waiter may spend reading its peers' arrival counters.
constexpr std::chrono::milliseconds kCounterReadBudget{500};
constexpr std::chrono::milliseconds kStallWindow{200};
// The most ranks a timeout message lists by name.
constexpr size_t kListedRanks = 16;

class CollectiveWork final : public Work {
 public:
  CollectiveWork(std::shared_ptr<Group> group, std::shared_ptr<CollectiveOp> op)
      : group_(std::move(group)), op_(std::move(op)) {}
  void wait() override { group_->wait(op_); }
  bool test() override { return group_->test(op_); }

 private:
  std::shared_ptr<Group> group_;
  std::shared_ptr<CollectiveOp> op_;
};

}  // namespace

WorkHandle Group::issue(std::shared_ptr<CollectiveOp> op) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    op->check_agreement = options_.check_agreement;
    op->max_elements = options_.max_elements_per_call;
    op->seq = ++seq_;
    counters_.arrive(op->seq);
    if (broken_) {
      fail_locked(*op, label() + ": " + op->describe() + " was not run: " + unusable_message());
    } else if (!op->check_agreement && !op->invalid.empty()) {
      // Without the handshake the peers cannot be told; fail here, they will time out.
      fail_locked(*op, label() + ": " + op->describe() + ": " + op->invalid);
    } else {
      op->issued = Clock::now();
      queue_.push_back(op);
      start_worker_locked();
      // Whether to wake the communication thread now. A blocking collective waits right after
      // issuing and runs inline; waking the thread for it would cost a wake-up per operation
      // (measured: 20-60 us at 32 KiB-1 MiB on 2 cores). So the thread is woken at once only
      // when the caller will not run it (no handshake), when the group is used asynchronously
      // (earlier operations still queued, or seen before), or when no ticker runs; otherwise
      // the ticker wakes it if the operation is still untouched a millisecond later.
      const bool async_use = queue_.size() > 1;
      if (async_use) eager_wake_ = true;
      if (!op->check_agreement || eager_wake_ || !ticker_running()) wake_worker_locked();
    }
  }
  return std::make_shared<CollectiveWork>(shared_from_this(), std::move(op));
}

void Group::wait(const std::shared_ptr<CollectiveOp>& op) {
  activity::Scope waiting(world_ranks_[static_cast<size_t>(rank_)], collective_name(op->call.kind), name_,
                          op->seq);  // heartbeats
  std::unique_lock<std::mutex> lock(mutex_);
  const auto started = Clock::now();
  const auto deadline = started + options_.comm.timeout;
  auto finished = [&] {
    return op->phase == CollectiveOp::Phase::Done || op->phase == CollectiveOp::Phase::Failed;
  };
  while (!finished()) {
    // Run what precedes `op` (and `op` itself) on this thread when nobody is running it. Only
    // with a handshake: a bare blocking transfer could not honour the deadline.
    if (!executing_ && !queue_.empty() && queue_.front()->check_agreement) {
      // Its own operation, waited for right after issue: the blocking pattern.
      if (queue_.front() == op && Clock::now() - op->issued < kPark) eager_wake_ = false;
      auto next = claim_locked();
      lock.unlock();
      const bool in_time = execute(next, deadline);
      lock.lock();
      release_locked();
      if (!in_time) throw timeout_locked(op, next, started);
      continue;
    }
    ++waiters_;
    const std::cv_status status = done_cv_.wait_until(lock, deadline);
    --waiters_;
    if (status == std::cv_status::timeout && !finished()) {
      throw timeout_locked(op, running_ ? running_ : op, started);
    }
  }
  if (op->phase == CollectiveOp::Phase::Failed) std::rethrow_exception(op->error);
}

bool Group::test(const std::shared_ptr<CollectiveOp>& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (op->phase == CollectiveOp::Phase::Queued) {
    // Polled, not waited for: the caller expects the operation to progress on its own.
    eager_wake_ = true;
    wake_worker_locked();
  }
  if (op->phase == CollectiveOp::Phase::Failed) std::rethrow_exception(op->error);
  return op->phase == CollectiveOp::Phase::Done;
}

bool Group::execute(const std::shared_ptr<CollectiveOp>& op, std::optional<Clock::time_point> deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (broken_) {
      fail_locked(*op, label() + ": " + op->describe() + " was not run: " + unusable_message());
      wake_waiters_locked();
      return true;
    }
    op->phase = op->check_agreement ? CollectiveOp::Phase::Handshake : CollectiveOp::Phase::Transfer;
  }
  try {
    if (op->check_agreement) {
      const Poll result = handshake(*op, deadline);
      if (result != Poll::Done) {
        // MPI still owns the handshake buffers of the abandoned request.
        keep_alive(op);
        if (result == Poll::Abandoned) {
          // Usually the waiter that gave up failed it already; otherwise the group is closing.
          complete(op, std::make_exception_ptr(
                           Error(label() + ": " + op->describe() + " was abandoned: the group was closed")));
        }
        return result != Poll::TimedOut;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (op->phase == CollectiveOp::Phase::Handshake) op->phase = CollectiveOp::Phase::Transfer;
    }
    op->transfer(*this, *op);
    complete(op, nullptr);
  } catch (...) {
    complete(op, std::current_exception());
  }
  return true;
}

void Group::fail_locked(CollectiveOp& op, const std::string& message) {
  if (op.phase == CollectiveOp::Phase::Done || op.phase == CollectiveOp::Phase::Failed) return;
  op.phase = CollectiveOp::Phase::Failed;
  op.error = std::make_exception_ptr(Error(message));
}

void Group::complete(const std::shared_ptr<CollectiveOp>& op, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (op->phase != CollectiveOp::Phase::Done && op->phase != CollectiveOp::Phase::Failed) {
    op->phase = error ? CollectiveOp::Phase::Failed : CollectiveOp::Phase::Done;
    op->error = std::move(error);
  }
  wake_waiters_locked();
}

std::string Group::unusable_message() const {
  return "the group is unusable since " + broken_reason_;
}

Error Group::timeout_locked(const std::shared_ptr<CollectiveOp>& waited, const std::shared_ptr<CollectiveOp>& blocking,
                            Clock::time_point started) {
  counters_.give_up();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  std::string message = label() + ": " + waited->describe() + " timed out after " + std::to_string(ms) +
                        " ms on rank " + std::to_string(rank_) + " (world rank " +
                        std::to_string(world_ranks_[static_cast<size_t>(rank_)]) + ")";
  if (blocking && blocking != waited) message += ", waiting for " + blocking->describe() + " to finish first";
  message += ": ";

  // Only a handshake proves arrival; without one, a transfer may be waiting for a missing rank.
  const bool in_transfer =
      blocking && blocking->check_agreement && blocking->phase == CollectiveOp::Phase::Transfer;
  const int64_t seq = blocking ? std::min(blocking->seq, waited->seq) : waited->seq;
  if (in_transfer) {
    message += "every rank arrived at " + blocking->describe() + ", but the transfer did not finish in time";
  } else {
    message += missing_ranks(seq);
  }
  broken_ = true;
  broken_reason_ = waited->describe() + " timed out";
  if (blocking && blocking->phase == CollectiveOp::Phase::Handshake) blocking->abandoned = true;
  fail_locked(*waited, message);
  if (blocking) fail_locked(*blocking, message);
  for (auto& op : queue_) fail_locked(*op, label() + ": " + op->describe() + " was not run: " + unusable_message());
  queue_.clear();
  wake_waiters_locked();
  return Error(message);
}

std::string Group::missing_ranks(int64_t seq) {
  const std::vector<ArrivalCounters::Reading> counters = counters_.read(kCounterReadBudget);
  std::vector<int> behind;
  std::vector<int> unknown;
  for (int r = 0; r < size_; ++r) {
    const int64_t c = counters[static_cast<size_t>(r)].entered;
    if (c < 0) {
      unknown.push_back(r);
    } else if (c < seq) {
      behind.push_back(r);
    }
  }
  if (!counters_.available()) {
    return "which ranks never arrived is unknown (arrival counters " + counters_.description() + ")";
  }
  if (behind.empty() && unknown.empty()) return stalled_ranks(seq, counters);
  std::string message = "ranks that never arrived at #" + std::to_string(seq) + ":";
  for (size_t i = 0; i < behind.size() && i < kListedRanks; ++i) {
    const int r = behind[i];
    message += (i ? ", " : " ") + std::to_string(r) + " (world rank " +
               std::to_string(world_ranks_[static_cast<size_t>(r)]) + ", last entered #" +
               std::to_string(counters[static_cast<size_t>(r)].entered) + ")";
  }
  if (behind.size() > kListedRanks) message += " and " + std::to_string(behind.size() - kListedRanks) + " more";
  if (!unknown.empty()) message += "; counters unreadable for ranks " + rank_ranges(unknown);
  return message;
}

std::string Group::stalled_ranks(int64_t seq, const std::vector<ArrivalCounters::Reading>& before) {
  // A rank in a handshake polls it about every millisecond; one whose polls stand still for the
  // window is stopped, or stuck in its operation outside MPI.
  std::this_thread::sleep_for(kStallWindow);
  const std::vector<ArrivalCounters::Reading> after = counters_.read(kCounterReadBudget);
  std::vector<int> stalled;
  for (int r = 0; r < size_; ++r) {
    const size_t i = static_cast<size_t>(r);
    if (r != rank_ && before[i].polls >= 0 && after[i].polls == before[i].polls) stalled.push_back(r);
  }
  std::string message = "every rank entered #" + std::to_string(seq) + ", but the handshake did not complete";
  if (stalled.empty()) return message + " (a rank may still be busy with an earlier operation of this group)";
  message += "; ranks that stopped making progress in it (no handshake poll for " +
             std::to_string(kStallWindow.count()) + " ms; stopped, or stuck outside MPI):";
  for (size_t i = 0; i < stalled.size() && i < kListedRanks; ++i) {
    message += (i ? ", " : " ") + std::to_string(stalled[i]) + " (world rank " +
               std::to_string(world_ranks_[static_cast<size_t>(stalled[i])]) + ")";
  }
  if (stalled.size() > kListedRanks) message += " and " + std::to_string(stalled.size() - kListedRanks) + " more";
  return message;
}

}  // namespace loom::comm::mpi_detail
