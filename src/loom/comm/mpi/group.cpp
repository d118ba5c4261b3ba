// The life cycle of an mpi group: creation (and split), options, closing and destruction.
#include <algorithm>
#include <cstdio>

#include "loom/comm/mpi/communicator.h"
#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

namespace {

// How long closing a failed group waits for its communication thread to leave MPI.
constexpr std::chrono::milliseconds kStuckPatience{2000};

}  // namespace

std::shared_ptr<Group> Group::create(MPI_Comm comm, std::string name, const MpiOptions& options) {
  std::shared_ptr<Group> group(new Group());
  group->comm_ = comm;
  group->name_ = std::move(name);
  group->options_ = options;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &group->rank_);
  MPI_Comm_size(comm, &group->size_);
  const std::string where = group->label() + ": creating the group";
  mpi_check(MPI_Comm_dup(comm, &group->p2p_), where);
  mpi_check(MPI_Comm_dup(comm, &group->header_), where);
  MPI_Comm_set_errhandler(group->p2p_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(group->header_, MPI_ERRORS_RETURN);

  MPI_Group mine = MPI_GROUP_NULL;
  MPI_Group world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> local(static_cast<size_t>(group->size_));
  for (int r = 0; r < group->size_; ++r) local[static_cast<size_t>(r)] = r;
  group->world_ranks_.assign(static_cast<size_t>(group->size_), -1);
  mpi_check(MPI_Group_translate_ranks(mine, group->size_, local.data(), world, group->world_ranks_.data()), where);
  MPI_Group_free(&mine);
  MPI_Group_free(&world);

  int* tag_ub = nullptr;
  int found = 0;
  MPI_Comm_get_attr(group->p2p_, MPI_TAG_UB, &tag_ub, &found);
  if (found && tag_ub != nullptr) group->tag_ub_ = *tag_ub;

  group->counters_.create(comm, options.shared_memory_counters);
  watch_group(group);
  return group;
}

Group::~Group() {
  // close() normally ran and the thread is gone; otherwise stop it without anything collective.
  if (worker_.joinable()) {
    shutdown_ = true;
    work_cv_.notify_all();
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();
    } else {
      worker_.join();
    }
  }
}

void Group::close(bool unwinding) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (closed_) return;
  closed_ = true;
  // Operations issued but never waited for still have to run: the peers expect them.
  if (!unwinding) drain_locked(lock, Clock::now() + options_.comm.timeout);
  for (auto& op : queue_) fail_locked(*op, label() + ": " + op->describe() + " never ran: the group was closed");
  queue_.clear();
  const bool stuck = !stop_worker_locked(lock, unwinding);
  lock.unlock();
  if (worker_.joinable()) worker_.join();
  counters_.retire();
  // MPI_Comm_free does not wait for the peers (Open MPI and MPICH free locally, deferring the
  // release while operations are pending), so it is safe even while unwinding; a communicator a
  // stuck thread is inside stays.
  if (!stuck) {
    MPI_Comm_free(&header_);
    MPI_Comm_free(&p2p_);
    MPI_Comm_free(&comm_);
  }
}

void Group::drain_locked(std::unique_lock<std::mutex>& lock, Clock::time_point deadline) {
  while (!broken_ && (executing_ || !queue_.empty())) {
    if (!executing_ && queue_.front()->check_agreement) {
      auto next = claim_locked();
      lock.unlock();
      const bool finished = execute(next, deadline);
      lock.lock();
      release_locked();
      if (!finished) {
        const Error error = timeout_locked(next, next, deadline - options_.comm.timeout);
        std::fprintf(stderr, "loom: closing %s: %s\n", label().c_str(), error.what());
      }
      continue;
    }
    ++waiters_;
    const std::cv_status status = done_cv_.wait_until(lock, deadline);
    --waiters_;
    if (status == std::cv_status::timeout && (executing_ || !queue_.empty())) {
      broken_ = true;
      broken_reason_ = "the group was closed while operations were still pending";
      if (running_ && running_->phase == CollectiveOp::Phase::Handshake) running_->abandoned = true;
      std::fprintf(stderr, "loom: closing %s: pending operations did not finish within the timeout\n",
                   label().c_str());
      break;
    }
  }
}

bool Group::stop_worker_locked(std::unique_lock<std::mutex>& lock, bool unwinding) {
  shutdown_ = true;
  work_cv_.notify_all();
  if (!worker_.joinable()) return true;
  // Idle or in a handshake, the thread stops at once; in a transfer it stops when that ends,
  // which after a failure (a peer gone) may be never.
  const auto patience = broken_ || unwinding
                            ? std::min<std::chrono::milliseconds>(options_.comm.timeout, kStuckPatience)
                            : options_.comm.timeout;
  ++waiters_;
  const bool exited = done_cv_.wait_until(lock, Clock::now() + patience, [&] { return worker_exited_; });
  --waiters_;
  if (exited) return true;
  // Blocked inside an MPI transfer whose peers never came; it cannot be interrupted.
  worker_.detach();
  mark_communication_thread_stuck(label() + ": the communication thread is blocked in " +
                                  (running_ ? running_->describe() : std::string("an MPI call")));
  return false;
}

MpiOptions Group::options() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

void Group::set_options(const MpiOptions& options) {
  LOOM_CHECK(options.max_elements_per_call >= 1 && options.max_elements_per_call <= INT_MAX,
        label() + ": max_elements_per_call must be in [1, " + std::to_string(INT_MAX) + "] (got " +
            std::to_string(options.max_elements_per_call) + ")");
  LOOM_CHECK(options.comm.timeout.count() > 0, label() + ": the timeout must be positive");
  std::lock_guard<std::mutex> lock(mutex_);
  options_ = options;
}

std::string Group::label() const {
  return "mpi group '" + name_ + "' (" + std::to_string(size_) + (size_ == 1 ? " rank)" : " ranks)");
}

void* Group::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_.reset();  // release first: the old and the new buffer need not coexist
    scratch_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

std::unique_ptr<Communicator> split_group(Group& group, const CollectiveOp& op) {
  const CollectiveCall& call = op.call;
  MPI_Comm child = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(group.comm(), call.color < 0 ? MPI_UNDEFINED : call.color, call.key, &child),
            group.label() + ": " + op.describe());
  if (child == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(Group::create(child, call.name, group.options()));
}

}  // namespace loom::comm::mpi_detail
