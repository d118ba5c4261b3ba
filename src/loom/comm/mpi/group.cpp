#include "loom/comm/mpi/group.h"

#include <algorithm>
#include <map>

#include "loom/comm/activity.h"
#include "loom/comm/arguments.h"
#include "loom/core/error.h"

namespace loom::comm::mpi_detail {

namespace {

// How long a timed-out waiter may spend reading its peers' arrival counters.
constexpr std::chrono::milliseconds kCounterReadBudget{500};
// How long the communication thread leaves a newly issued operation to its caller (see
// worker_loop).
constexpr std::chrono::microseconds kClaimGrace{50};
// The ticker's period, and how old an untouched operation must be for it to wake the thread.
constexpr std::chrono::microseconds kTick{1000};
constexpr std::chrono::microseconds kPark{100};
// How long closing a failed group waits for its communication thread to leave MPI.
constexpr std::chrono::milliseconds kStuckPatience{2000};
// The most ranks a timeout message lists by name.
constexpr size_t kListedRanks = 16;

std::mutex& keep_alive_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Never destroyed: objects in it may be written by MPI until the process exits.
std::vector<std::shared_ptr<void>>& kept_alive() {
  static auto* objects = new std::vector<std::shared_ptr<void>>();
  return *objects;
}

std::atomic<bool> g_stuck{false};
std::mutex g_stuck_mutex;
std::string g_stuck_what;

// "0-3,5,7-8".
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(ranks[j]);
    }
    i = j + 1;
  }
  return out;
}

int64_t hash_counts(const std::vector<int64_t>& counts) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the 8 bytes of each count
  for (int64_t c : counts) {
    for (int b = 0; b < 8; ++b) {
      h ^= (static_cast<uint64_t>(c) >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return static_cast<int64_t>(h >> 1);  // non-negative, so that -h cannot overflow
}

Descriptor make_descriptor(const CollectiveOp& op) {
  Descriptor d{};
  d[kKind] = static_cast<int64_t>(op.kind);
  d[kDType] = static_cast<int64_t>(op.dtype);
  d[kCount] = op.count;
  d[kReduce] = -1;
  d[kRoot] = -1;
  d[kCountsHash] = 0;
  switch (op.kind) {
    case OpKind::AllReduce:
    case OpKind::ReduceScatter:
      d[kReduce] = static_cast<int64_t>(op.reduce);
      break;
    case OpKind::Reduce:
      d[kReduce] = static_cast<int64_t>(op.reduce);
      d[kRoot] = op.root;
      break;
    case OpKind::Broadcast:
      d[kRoot] = op.root;
      break;
    case OpKind::AllGatherV: {
      int64_t total = 0;
      for (int64_t c : op.counts) total += c;
      d[kCount] = total;
      d[kCountsHash] = hash_counts(op.counts);
      break;
    }
    case OpKind::AllToAllV:
      d[kCount] = -1;  // the per-pair counts are checked separately
      break;
    case OpKind::Barrier:
    case OpKind::Split:
      d[kDType] = -1;
      d[kCount] = -1;
      break;
    default:
      break;
  }
  d[kInvalid] = op.invalid.empty() ? 0 : 1;
  return d;
}

}  // namespace

std::string op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::AllGather: return "all_gather";
    case OpKind::AllGatherV: return "all_gather_v";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::AllToAllV: return "all_to_all_v";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
  }
  return "operation " + std::to_string(static_cast<int64_t>(kind));
}

std::string describe_descriptor(const Descriptor& d) {
  if (d[kKind] < static_cast<int64_t>(OpKind::AllReduce) || d[kKind] > static_cast<int64_t>(OpKind::Split)) {
    return "unknown operation " + std::to_string(d[kKind]);
  }
  const auto kind = static_cast<OpKind>(d[kKind]);
  std::string out = op_kind_name(kind);
  std::vector<std::string> parts;
  if (d[kDType] >= 0) {
    std::string part = dtype_name(static_cast<DType>(d[kDType]));
    if (d[kCount] >= 0) part += " x " + std::to_string(d[kCount]);
    parts.push_back(part);
  }
  if (kind == OpKind::AllGatherV) parts.push_back("counts hash " + std::to_string(d[kCountsHash]));
  if (d[kReduce] >= 0) parts.push_back(reduce_op_name(static_cast<ReduceOp>(d[kReduce])));
  if (d[kRoot] >= 0) parts.push_back("root " + std::to_string(d[kRoot]));
  if (d[kInvalid] != 0) parts.push_back("invalid arguments");
  if (!parts.empty()) {
    out += " (";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
    out += ")";
  }
  return out;
}

std::string CollectiveOp::describe() const {
  Descriptor d = make_descriptor(*this);
  d[kInvalid] = 0;
  std::string text = describe_descriptor(d);
  const size_t paren = text.find(" (");
  const std::string numbered = " #" + std::to_string(seq);
  if (paren == std::string::npos) return text + numbered;
  return text.substr(0, paren) + numbered + text.substr(paren);
}

void keep_alive(std::shared_ptr<void> object) {
  std::lock_guard<std::mutex> lock(keep_alive_mutex());
  kept_alive().push_back(std::move(object));
}

bool communication_thread_stuck(std::string* what) {
  if (!g_stuck.load()) return false;
  if (what != nullptr) {
    std::lock_guard<std::mutex> lock(g_stuck_mutex);
    *what = g_stuck_what;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Ticker

namespace {

class Ticker {
 public:
  static Ticker& instance() {
    static auto* ticker = new Ticker();  // never destroyed: stop() ends the thread
    return *ticker;
  }
  void start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (running_) return;
    running_ = true;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!running_) return;
      running_ = false;
    }
    cv_.notify_all();
    thread_.join();
  }
  bool running() {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  void add(std::weak_ptr<Group> group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(std::move(group));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (running_) {
      cv_.wait_for(lock, kTick);
      if (!running_) break;
      std::vector<std::shared_ptr<Group>> live;
      std::erase_if(groups_, [](const std::weak_ptr<Group>& weak) { return weak.expired(); });
      for (const auto& weak : groups_) {
        if (std::shared_ptr<Group> group = weak.lock()) live.push_back(std::move(group));
      }
      lock.unlock();
      const auto now = Clock::now();
      for (const auto& group : live) group->tick(now);
      live.clear();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  bool running_ = false;
  std::thread thread_;
  std::vector<std::weak_ptr<Group>> groups_;
};

}  // namespace

void start_ticker() { Ticker::instance().start(); }
void stop_ticker() { Ticker::instance().stop(); }

// ---------------------------------------------------------------------------------------------
// Work handles

namespace {

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

// A send or a receive. Every send is exactly one data message, whatever its size (beyond
// max_elements a derived datatype carries it), so that a receive whose count disagrees still
// consumes exactly its sender's message and the stream of one (peer, tag) stays in step. With
// agreement checks on, a header (count, dtype) travels ahead on a communicator of its own, so
// the receiver can name both sides of a mismatch; without it the receiver still compares the
// number of elements that arrived with its own count.
class P2pWork final : public Work {
 public:
  P2pWork(std::shared_ptr<Group> group, bool is_send, void* data, int64_t count, DType dtype, int peer, int tag,
          int64_t number, bool check, int64_t max_elements, std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        is_send_(is_send),
        count_(count),
        dtype_(dtype),
        peer_(peer),
        tag_(tag),
        number_(number),
        timeout_(timeout),
        header_(std::make_shared<std::array<int64_t, 2>>()) {
    if (check) {
      if (is_send_) {
        (*header_)[0] = count;
        (*header_)[1] = static_cast<int64_t>(dtype);
        mpi_check(MPI_Isend(header_->data(), 2, MPI_INT64_T, peer, tag, group_->header_comm(), &header_request_),
                  [this] { return where(); });
      } else {
        mpi_check(MPI_Irecv(header_->data(), 2, MPI_INT64_T, peer, tag, group_->header_comm(), &header_request_),
                  [this] { return where(); });
      }
    }
    // One message of `count` elements: a plain count when it fits MPI's int, otherwise one
    // element of a type made of q blocks of max_elements plus the remainder.
    MPI_Datatype type = mpi_type(dtype);
    int type_count = static_cast<int>(count);
    MPI_Datatype message_type = MPI_DATATYPE_NULL;
    if (count > max_elements) {
      const int64_t q = count / max_elements;
      const int64_t r = count % max_elements;
      MPI_Datatype block = MPI_DATATYPE_NULL;
      MPI_Datatype blocks = MPI_DATATYPE_NULL;
      MPI_Type_contiguous(static_cast<int>(max_elements), type, &block);
      MPI_Type_contiguous(static_cast<int>(q), block, &blocks);
      if (r == 0) {
        message_type = blocks;
        MPI_Type_free(&block);
      } else {
        MPI_Datatype tail = MPI_DATATYPE_NULL;
        MPI_Type_contiguous(static_cast<int>(r), type, &tail);
        int lengths[2] = {1, 1};
        MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(q * max_elements * static_cast<int64_t>(dtype_size(dtype)))};
        MPI_Datatype parts[2] = {blocks, tail};
        MPI_Type_create_struct(2, lengths, displacements, parts, &message_type);
        MPI_Type_free(&block);
        MPI_Type_free(&blocks);
        MPI_Type_free(&tail);
      }
      MPI_Type_commit(&message_type);
      type = message_type;
      type_count = 1;
    }
    const MPI_Comm comm = group_->p2p_comm();
    const int rc = is_send_ ? MPI_Isend(data, type_count, type, peer, tag, comm, &data_request_)
                            : MPI_Irecv(data, type_count, type, peer, tag, comm, &data_request_);
    // Freeing a datatype that pending operations use is allowed: MPI keeps it until they finish.
    if (message_type != MPI_DATATYPE_NULL) MPI_Type_free(&message_type);
    mpi_check(rc, [this] { return where(); });
  }

  ~P2pWork() override {
    // A dropped handle: nothing may land in a buffer the caller is about to free, and our header
    // must outlive a send MPI still holds.
    cancel_receives();
    if (data_request_ != MPI_REQUEST_NULL) MPI_Request_free(&data_request_);
    if (header_request_ != MPI_REQUEST_NULL) {
      MPI_Request_free(&header_request_);
      keep_alive(header_);
    }
  }

  void wait() override {
    activity::Scope waiting(group_->world_ranks()[static_cast<size_t>(group_->rank())], is_send_ ? "send" : "recv",
                            group_->name(), number_);  // for heartbeats
    std::lock_guard<std::mutex> lock(mutex_);
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    Backoff backoff;
    while (!progress_locked()) {
      if (Clock::now() >= deadline) {
        if (progress_locked()) break;
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
        std::string message = where() + " timed out after " + std::to_string(ms) + " ms: " + peer_name() +
                              (is_send_ ? " never posted the matching receive" : " never sent a matching message");
        if (!mismatch_.empty()) message = where() + ": the ranks disagree: " + mismatch_;
        cancel_receives();
        keep_alive(header_);
        error_ = std::make_exception_ptr(Error(message));
        finished_ = true;
        break;
      }
      backoff.pause();
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool test() override {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool done = progress_locked();
    if (done && error_) std::rethrow_exception(error_);
    return done;
  }

 private:
  std::string peer_name() const {
    const std::vector<int>& world = group_->world_ranks();
    return "rank " + std::to_string(peer_) + " (world rank " + std::to_string(world[static_cast<size_t>(peer_)]) + ")";
  }
  std::string where() const {
    return group_->label() + ": " + (is_send_ ? "send #" : "recv #") + std::to_string(number_) +
           (is_send_ ? " to " : " from ") + peer_name() + ", tag " + std::to_string(tag_) + ", " +
           dtype_name(dtype_) + " x " + std::to_string(count_);
  }

  void cancel_receives() {
    if (is_send_) return;
    for (MPI_Request* request : {&header_request_, &data_request_}) {
      if (*request == MPI_REQUEST_NULL) continue;
      MPI_Cancel(request);
      MPI_Request_free(request);
    }
  }

  // Tests what is outstanding; true once everything completed (error_ set on a mismatch).
  bool progress_locked() {
    if (finished_) return true;
    int done = 0;
    if (header_request_ != MPI_REQUEST_NULL) {
      mpi_check(MPI_Test(&header_request_, &done, MPI_STATUS_IGNORE), [this] { return where(); });
      if (done && !is_send_) {
        const int64_t sent_count = (*header_)[0];
        const int64_t sent_dtype = (*header_)[1];
        if (sent_count != count_ || sent_dtype != static_cast<int64_t>(dtype_)) {
          const std::string sent_name = sent_dtype >= 0 && sent_dtype <= static_cast<int64_t>(DType::U16)
                                            ? dtype_name(static_cast<DType>(sent_dtype))
                                            : "dtype " + std::to_string(sent_dtype);
          // Not reported yet: the sender's data message must still be consumed by our receive.
          mismatch_ = peer_name() + " sends " + sent_name + " x " + std::to_string(sent_count) + ", this rank expects " +
                      dtype_name(dtype_) + " x " + std::to_string(count_);
        }
      }
    }
    if (data_request_ != MPI_REQUEST_NULL) {
      MPI_Status status;
      const int rc = MPI_Test(&data_request_, &done, &status);
      if (rc != MPI_SUCCESS) {
        int error_class = 0;
        MPI_Error_class(rc, &error_class);
        if (error_class != MPI_ERR_TRUNCATE) mpi_check(rc, [this] { return where(); });
        // A longer message than this receive: it was consumed, truncated.
        if (mismatch_.empty()) {
          mismatch_ = peer_name() + " sends more than the " + std::to_string(count_) + " elements this rank expects";
        }
        data_request_ = MPI_REQUEST_NULL;
      } else if (done && !is_send_) {
        MPI_Count received = 0;
        MPI_Get_elements_x(&status, mpi_type(dtype_), &received);
        if (received != count_ && mismatch_.empty()) {
          mismatch_ = peer_name() + " sends fewer elements (" + std::to_string(received) + ") than the " +
                      std::to_string(count_) + " this rank expects";
        }
      }
    }
    if (header_request_ != MPI_REQUEST_NULL || data_request_ != MPI_REQUEST_NULL) return false;
    finished_ = true;
    if (!mismatch_.empty()) error_ = std::make_exception_ptr(Error(where() + ": the ranks disagree: " + mismatch_));
    return true;
  }

  std::shared_ptr<Group> group_;
  bool is_send_;
  int64_t count_;
  DType dtype_;
  int peer_;
  int tag_;
  int64_t number_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<std::array<int64_t, 2>> header_;
  MPI_Request header_request_ = MPI_REQUEST_NULL;
  MPI_Request data_request_ = MPI_REQUEST_NULL;
  std::mutex mutex_;
  bool finished_ = false;
  std::string mismatch_;
  std::exception_ptr error_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Group: creation and teardown

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
  Ticker::instance().add(group);
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
  const auto deadline = Clock::now() + options_.comm.timeout;
  if (!unwinding) {
    // Operations issued but never waited for still have to run: the peers expect them.
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
  for (auto& op : queue_) fail_locked(*op, label() + ": " + op->describe() + " never ran: the group was closed");
  queue_.clear();
  shutdown_ = true;
  work_cv_.notify_all();
  bool stuck = false;
  if (worker_.joinable()) {
    // Idle or in a handshake, the thread stops at once; in a transfer it stops when that ends,
    // which after a failure (a peer gone) may be never.
    const auto patience =
        broken_ || unwinding ? std::min<std::chrono::milliseconds>(options_.comm.timeout, kStuckPatience)
                             : options_.comm.timeout;
    ++waiters_;
    const bool exited = done_cv_.wait_until(lock, Clock::now() + patience, [&] { return worker_exited_; });
    --waiters_;
    if (!exited) {
      // Blocked inside an MPI transfer whose peers never came; it cannot be interrupted.
      stuck = true;
      const std::string what = label() + ": the communication thread is blocked in " +
                               (running_ ? running_->describe() : std::string("an MPI call"));
      worker_.detach();
      std::lock_guard<std::mutex> stuck_lock(g_stuck_mutex);
      g_stuck_what = what;
      g_stuck = true;
    }
  }
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

MpiOptions Group::options() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return options_;
}

void Group::set_options(const MpiOptions& options) {
  check(options.max_elements_per_call >= 1 && options.max_elements_per_call <= INT_MAX,
        label() + ": max_elements_per_call must be in [1, " + std::to_string(INT_MAX) + "] (got " +
            std::to_string(options.max_elements_per_call) + ")");
  check(options.comm.timeout.count() > 0, label() + ": the timeout must be positive");
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

// ---------------------------------------------------------------------------------------------
// Issue, execution, waiting

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
      if (!op->check_agreement || eager_wake_ || !Ticker::instance().running()) wake_worker_locked();
    }
  }
  return std::make_shared<CollectiveWork>(shared_from_this(), std::move(op));
}

WorkHandle Group::issue_p2p(bool is_send, void* data, int64_t count, DType dtype, int peer, int tag) {
  int64_t number = 0;
  MpiOptions options;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    number = ++p2p_seq_;
    options = options_;
  }
  // Messages to this rank itself are not supported; tags run up to MPI_TAG_UB.
  const std::string problem =
      message_problem(data, count, peer, tag, rank_, size_, MessageLimits{.max_tag = tag_ub_, .max_tag_name = "MPI_TAG_UB", .to_self = false});
  if (!problem.empty()) throw Error(label() + ": " + (is_send ? "send #" : "recv #") + std::to_string(number) + ": " + problem);
  return std::make_shared<P2pWork>(shared_from_this(), is_send, data, count, dtype, peer, tag, number,
                                   options.check_agreement, options.max_elements_per_call, options.comm.timeout);
}

void Group::start_worker_locked() {
  if (worker_.joinable() || shutdown_) return;
  // The thread holds the group: a thread left blocked in MPI (see close()) must not outlive it.
  worker_ = std::thread([self = shared_from_this()] { self->worker_loop(); });
}

void Group::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    worker_idle_ = true;
    work_cv_.wait(lock, [&] { return shutdown_.load() || (!executing_ && !queue_.empty()); });
    worker_idle_ = false;
    if (shutdown_) break;
    // A caller that waits right after issuing (every blocking collective) runs the operation
    // itself; give it the moment to claim it, so that it need not sleep while this thread runs
    // it. (Without the handshake a caller never runs it: see wait().)
    const auto claimable = queue_.front()->issued + kClaimGrace;
    if (queue_.front()->check_agreement && Clock::now() < claimable) {
      lock.unlock();
      std::this_thread::sleep_until(claimable);
      lock.lock();
      if (shutdown_) break;
      if (executing_ || queue_.empty()) continue;
    }
    auto op = claim_locked();
    lock.unlock();
    execute(op, std::nullopt);
    lock.lock();
    release_locked();
  }
  worker_exited_ = true;
  done_cv_.notify_all();
}

std::shared_ptr<CollectiveOp> Group::claim_locked() {
  auto op = queue_.front();
  queue_.pop_front();
  executing_ = true;
  running_ = op;
  return op;
}

void Group::release_locked() {
  executing_ = false;
  running_.reset();
  wake_worker_locked();
  wake_waiters_locked();
}

void Group::wake_worker_locked() {
  if (worker_idle_ && !executing_ && !queue_.empty()) work_cv_.notify_one();
}

void Group::tick(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (shutdown_ || executing_ || queue_.empty() || !worker_idle_) return;
  if (now - queue_.front()->issued < kPark) return;
  // Its caller went on without waiting: the group is used asynchronously.
  eager_wake_ = true;
  work_cv_.notify_one();
}

void Group::wake_waiters_locked() {
  if (waiters_ > 0) done_cv_.notify_all();
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
    if (op->kind == OpKind::Split) {
      run_split(*op);
    } else {
      run_transfer(*this, *op);
    }
    complete(op, nullptr);
  } catch (...) {
    complete(op, std::current_exception());
  }
  return true;
}

Group::Poll Group::poll(CollectiveOp& op, std::optional<Clock::time_point> deadline, const char* what) {
  Backoff backoff;
  while (true) {
    int done = 0;
    mpi_check(MPI_Test(&op.pending, &done, MPI_STATUS_IGNORE),
              [&] { return label() + ": " + op.describe() + ": " + what; });
    if (done) return Poll::Done;
    if (op.abandoned.load() || shutdown_.load()) return Poll::Abandoned;
    if (deadline && Clock::now() >= *deadline) {
      op.abandoned = true;
      return Poll::TimedOut;
    }
    backoff.pause();
  }
}

Group::Poll Group::handshake(CollectiveOp& op, std::optional<Clock::time_point> deadline) {
  op.descriptor = make_descriptor(op);
  for (int i = 0; i < kFields; ++i) {
    op.agreement[static_cast<size_t>(i)] = op.descriptor[static_cast<size_t>(i)];
    op.agreement[static_cast<size_t>(kFields + i)] = -op.descriptor[static_cast<size_t>(i)];
  }
  auto where = [&] { return label() + ": " + op.describe(); };
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, op.agreement.data(), 2 * kFields, MPI_INT64_T, MPI_MAX, comm_, &op.pending),
            [&] { return where() + ": handshake"; });
  if (Poll r = poll(op, deadline, "handshake"); r != Poll::Done) return r;

  bool agree = op.agreement[kInvalid] == 0;
  for (int i = 0; i < kFields; ++i) {
    agree = agree && op.agreement[static_cast<size_t>(i)] == -op.agreement[static_cast<size_t>(kFields + i)];
  }
  if (!agree) {
    // Every rank saw the same disagreement, so every rank gathers the views and fails alike.
    op.views.assign(static_cast<size_t>(size_) * kFields, 0);
    mpi_check(MPI_Iallgather(op.descriptor.data(), kFields, MPI_INT64_T, op.views.data(), kFields, MPI_INT64_T, comm_,
                             &op.pending),
              [&] { return where() + ": gathering the ranks' views"; });
    if (Poll r = poll(op, deadline, "gathering the ranks' views"); r != Poll::Done) return r;
    std::map<Descriptor, std::vector<int>> by_view;
    for (int r = 0; r < size_; ++r) {
      Descriptor d{};
      std::copy_n(op.views.begin() + static_cast<std::ptrdiff_t>(r) * kFields, kFields, d.begin());
      by_view[d].push_back(r);
    }
    std::string message = where() + ": the ranks disagree on the operation:";
    if (by_view.size() == 1) message = where() + ": invalid arguments:";
    for (const auto& [view, ranks] : by_view) {
      message += (ranks.size() == 1 ? " rank " : " ranks ") + rank_ranges(ranks) + ": " + describe_descriptor(view) + ";";
    }
    message.pop_back();
    if (!op.invalid.empty()) message += ". This rank: " + op.invalid;
    throw Error(message);
  }

  if (op.kind == OpKind::AllToAllV) {
    // Rank r's send count to this rank must equal this rank's receive count from r.
    op.peer_sends.assign(static_cast<size_t>(size_), 0);
    mpi_check(MPI_Ialltoall(op.counts.data(), 1, MPI_INT64_T, op.peer_sends.data(), 1, MPI_INT64_T, comm_, &op.pending),
              [&] { return where() + ": exchanging counts"; });
    if (Poll r = poll(op, deadline, "exchanging counts"); r != Poll::Done) return r;
    op.pair_report = {0, -1, 0, 0};
    for (int r = 0; r < size_; ++r) {
      if (op.peer_sends[static_cast<size_t>(r)] != op.recv_counts[static_cast<size_t>(r)]) {
        op.pair_report = {1, r, op.recv_counts[static_cast<size_t>(r)], op.peer_sends[static_cast<size_t>(r)]};
        break;
      }
    }
    op.pair_reports.assign(static_cast<size_t>(size_) * 4, 0);
    mpi_check(MPI_Iallgather(op.pair_report.data(), 4, MPI_INT64_T, op.pair_reports.data(), 4, MPI_INT64_T, comm_,
                             &op.pending),
              [&] { return where() + ": checking counts"; });
    if (Poll r = poll(op, deadline, "checking counts"); r != Poll::Done) return r;
    std::string message;
    for (int r = 0; r < size_; ++r) {
      const int64_t* report = op.pair_reports.data() + static_cast<ptrdiff_t>(r) * 4;
      if (report[0] == 0) continue;
      message += " rank " + std::to_string(r) + " expects " + std::to_string(report[2]) + " elements from rank " +
                 std::to_string(report[1]) + ", which sends it " + std::to_string(report[3]) + ";";
    }
    if (!message.empty()) {
      message.pop_back();
      throw Error(where() + ": the ranks disagree on the counts:" + message);
    }
  }
  return Poll::Done;
}

void Group::run_split(CollectiveOp& op) {
  MPI_Comm child = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split(comm_, op.color < 0 ? MPI_UNDEFINED : op.color, op.key, &child),
            label() + ": " + op.describe());
  if (child == MPI_COMM_NULL) return;
  MpiOptions options;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    options = options_;
  }
  op.split_result = std::make_unique<MpiCommunicator>(Group::create(child, op.split_name, options));
}

void Group::wait(const std::shared_ptr<CollectiveOp>& op) {
  activity::Scope waiting(world_ranks_[static_cast<size_t>(rank_)], op_kind_name(op->kind), name_, op->seq);  // heartbeats
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

Error Group::timeout_locked(const std::shared_ptr<CollectiveOp>& waited, const std::shared_ptr<CollectiveOp>& blocking,
                            Clock::time_point started) {
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
    const std::vector<int64_t> counters = counters_.read(kCounterReadBudget);
    std::vector<int> behind;
    std::vector<int> unknown;
    for (int r = 0; r < size_; ++r) {
      const int64_t c = counters[static_cast<size_t>(r)];
      if (c < 0) {
        unknown.push_back(r);
      } else if (c < seq) {
        behind.push_back(r);
      }
    }
    if (!counters_.available()) {
      message += "which ranks never arrived is unknown (arrival counters " + counters_.description() + ")";
    } else if (behind.empty() && unknown.empty()) {
      message += "every rank entered #" + std::to_string(seq) +
                 ", but the handshake did not complete (a rank may still be busy with an earlier operation of "
                 "this group)";
    } else {
      message += "ranks that never arrived at #" + std::to_string(seq) + ":";
      for (size_t i = 0; i < behind.size() && i < kListedRanks; ++i) {
        const int r = behind[i];
        message += (i ? ", " : " ") + std::to_string(r) + " (world rank " +
                   std::to_string(world_ranks_[static_cast<size_t>(r)]) + ", last entered #" +
                   std::to_string(counters[static_cast<size_t>(r)]) + ")";
      }
      if (behind.size() > kListedRanks) message += " and " + std::to_string(behind.size() - kListedRanks) + " more";
      if (!unknown.empty()) message += "; counters unreadable for ranks " + rank_ranges(unknown);
    }
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

// ---------------------------------------------------------------------------------------------
// MpiCommunicator

namespace {

}  // namespace

MpiCommunicator::~MpiCommunicator() { group_->close(std::uncaught_exceptions() > 0); }

std::shared_ptr<CollectiveOp> MpiCommunicator::make_op(OpKind kind, DType dtype) {
  auto op = std::make_shared<CollectiveOp>();
  op->kind = kind;
  op->dtype = dtype;
  return op;
}

WorkHandle MpiCommunicator::all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp reduce) {
  auto op = make_op(OpKind::AllReduce, dtype);
  op->recv = data;
  op->count = count;
  op->reduce = reduce;
  op->invalid = argument_problem(CollectiveCall::all_reduce(data, count, dtype, reduce), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                                 ReduceOp reduce) {
  auto op = make_op(OpKind::ReduceScatter, dtype);
  op->send = send;
  op->recv = recv;
  op->count = recv_count;
  op->reduce = reduce;
  op->invalid = argument_problem(CollectiveCall::reduce_scatter(send, recv, recv_count, dtype, reduce), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) {
  auto op = make_op(OpKind::AllGather, dtype);
  op->send = send;
  op->recv = recv;
  op->count = send_count;
  op->invalid = argument_problem(CollectiveCall::all_gather(send, recv, send_count, dtype), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                               DType dtype) {
  auto op = make_op(OpKind::AllGatherV, dtype);
  op->send = send;
  op->recv = recv;
  op->counts.assign(counts.begin(), counts.end());
  op->invalid = argument_problem(CollectiveCall::all_gather_v(send, recv, counts, dtype), rank(), size());
  if (!op->invalid.empty()) op->counts.assign(static_cast<size_t>(size()), 0);
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::broadcast_async(void* data, int64_t count, DType dtype, int root) {
  auto op = make_op(OpKind::Broadcast, dtype);
  op->recv = data;
  op->count = count;
  op->root = root;
  op->invalid = argument_problem(CollectiveCall::broadcast(data, count, dtype, root), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp reduce,
                                         int root) {
  auto op = make_op(OpKind::Reduce, dtype);
  op->send = send;
  op->recv = recv;
  op->count = count;
  op->reduce = reduce;
  op->root = root;
  op->invalid = argument_problem(CollectiveCall::reduce(send, recv, count, dtype, reduce, root), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) {
  auto op = make_op(OpKind::AllToAll, dtype);
  op->send = send;
  op->recv = recv;
  op->count = count;
  op->invalid = argument_problem(CollectiveCall::all_to_all(send, recv, count, dtype), rank(), size());
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                               std::span<const int64_t> recv_counts, DType dtype) {
  auto op = make_op(OpKind::AllToAllV, dtype);
  op->send = send;
  op->recv = recv;
  op->counts.assign(send_counts.begin(), send_counts.end());
  op->recv_counts.assign(recv_counts.begin(), recv_counts.end());
  op->invalid = argument_problem(CollectiveCall::all_to_all_v(send, send_counts, recv, recv_counts, dtype), rank(),
                                 size());
  if (!op->invalid.empty()) {
    // The count exchange of the handshake needs one entry per rank.
    op->counts.assign(static_cast<size_t>(size()), 0);
    op->recv_counts.assign(static_cast<size_t>(size()), 0);
  }
  return group_->issue(std::move(op));
}

WorkHandle MpiCommunicator::barrier_async() { return group_->issue(make_op(OpKind::Barrier, DType::F32)); }

WorkHandle MpiCommunicator::send_async(const void* data, int64_t count, DType dtype, int peer, int tag) {
  return group_->issue_p2p(true, const_cast<void*>(data), count, dtype, peer, tag);
}

WorkHandle MpiCommunicator::recv_async(void* data, int64_t count, DType dtype, int peer, int tag) {
  return group_->issue_p2p(false, data, count, dtype, peer, tag);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  auto op = make_op(OpKind::Split, DType::F32);
  op->color = color;
  op->key = key;
  op->split_name = name;
  group_->issue(op)->wait();
  return std::move(op->split_result);
}

}  // namespace loom::comm::mpi_detail
