// Send and receive of the mpi backend: MPI_Isend / MPI_Irecv on the group's p2p communicator,
// polled by the waiter, with a header on a communicator of its own to detect mismatches.
#include <array>
#include <mutex>

#include "loom/comm/activity.h"
#include "loom/comm/arguments.h"
#include "loom/comm/mpi/group.h"

namespace loom::comm::mpi_detail {

namespace {

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

}  // namespace loom::comm::mpi_detail
