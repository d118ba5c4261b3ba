#include "loom/comm/threads/backend.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include "loom/comm/activity.h"
#include "loom/comm/arguments.h"
#include "loom/comm/threads/collectives.h"
#include "loom/comm/threads/group.h"
#include "loom/core/compute_queue.h"
#include "loom/core/device.h"
#include "loom/core/error.h"

namespace loom::comm {

namespace threads {
namespace {

// One queued collective of one rank.
struct Op {
  std::function<void()> run;
  bool done = false;  // these two under the Queue's mutex
  std::string error;
};

// The collectives one rank issued on one group, run one at a time in issue order, either by the
// rank's progress thread for the group (so they progress while the caller computes) or by a
// caller waiting for one of them (which saves two thread hand-offs per blocking call).
struct Queue {
  std::mutex mutex;
  std::condition_variable cv;  // queue changes and completions
  std::deque<std::shared_ptr<Op>> ops;
  bool executing = false;
  bool stopping = false;

  // Runs the front operation with the lock released; the caller checked that none is running.
  void run_front(std::unique_lock<std::mutex>& lock) {
    std::shared_ptr<Op> op = std::move(ops.front());
    ops.pop_front();
    executing = true;
    lock.unlock();
    std::string error;
    try {
      op->run();
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "comm (threads): an operation failed with an exception that is not a std::exception";
    }
    op->run = nullptr;  // drop what it captured
    lock.lock();
    executing = false;
    op->done = true;
    op->error = std::move(error);
    cv.notify_all();
  }
};

class OpWork final : public Work {
 public:
  OpWork(std::shared_ptr<Queue> queue, std::shared_ptr<Op> op) : queue_(std::move(queue)), op_(std::move(op)) {}

  // No deadline of its own: the operation's waits time out (Group::arrive), and so do those of
  // the operations queued before it on this group. While it is not done and nothing runs, the
  // front of the queue (this operation or one issued before it) is run here.
  void wait() override {
    std::unique_lock lock(queue_->mutex);
    while (!op_->done) {
      if (!queue_->executing && !queue_->ops.empty()) {
        queue_->run_front(lock);
      } else {
        queue_->cv.wait(lock);
      }
    }
    if (!op_->error.empty()) throw Error(op_->error);
  }

  bool test() override {
    std::lock_guard lock(queue_->mutex);
    if (!op_->done) return false;
    if (!op_->error.empty()) throw Error(op_->error);
    return true;
  }

 private:
  std::shared_ptr<Queue> queue_;
  std::shared_ptr<Op> op_;
};

std::string p2p_where(const Group& group, const P2PRequest& request) {
  const int self = request.is_send ? request.source : request.destination;
  const int peer = request.is_send ? request.destination : request.source;
  return "comm: group '" + group.name() + "' (threads) " + (request.is_send ? "send #" : "recv #") +
         std::to_string(request.index) + (request.is_send ? " to " : " from ") + "group rank " + std::to_string(peer) +
         " (world rank " + std::to_string(group.world_ranks()[peer]) + ") with tag " + std::to_string(request.tag) +
         ", " + std::to_string(request.count) + " " + dtype_name(request.dtype) + " elements, on group rank " +
         std::to_string(self) + " (world rank " + std::to_string(group.world_ranks()[self]) + "): ";
}

// Removes a request that was never matched from its queue and fails it.
void cancel_locked(Group& group, P2PRequest& request, const std::string& why) {
  P2PState& p2p = group.p2p();
  auto& queues = request.is_send ? p2p.sends : p2p.recvs;
  auto it = queues.find({request.source, request.destination, request.tag});
  if (it != queues.end()) {
    std::erase_if(it->second, [&](const auto& r) { return r.get() == &request; });
    if (it->second.empty()) queues.erase(it);
  }
  request.state = P2PRequest::State::Failed;
  request.error = p2p_where(group, request) + why;
  p2p.cv.notify_all();
}

// Pairs a send with a recv (under the p2p lock) and hands the copy to the receiver's thread.
void match_locked(Group& group, const std::shared_ptr<P2PRequest>& send, const std::shared_ptr<P2PRequest>& recv) {
  P2PState& p2p = group.p2p();
  if (send->count != recv->count || send->dtype != recv->dtype) {
    const std::string why = "the send carries " + std::to_string(send->count) + " " + dtype_name(send->dtype) +
                            " elements but the matching recv expects " + std::to_string(recv->count) + " " +
                            dtype_name(recv->dtype) + "; sender and receiver must agree on count and dtype";
    for (P2PRequest* r : {send.get(), recv.get()}) {
      r->state = P2PRequest::State::Failed;
      r->error = p2p_where(group, *r) + why;
    }
  } else {
    send->state = recv->state = P2PRequest::State::Matched;
    recv->partner = send;
    p2p.copies[recv->destination].push_back(recv);
  }
  p2p.cv.notify_all();
}

// Copies a matched message into the receiver's buffer and completes both sides. Called with the
// p2p lock held by `lock`, released during the copy; `recv` has been taken off the copy queue.
void copy_matched(Group& group, const std::shared_ptr<P2PRequest>& recv, std::unique_lock<std::mutex>& lock) {
  P2PState& p2p = group.p2p();
  std::shared_ptr<P2PRequest> send = std::move(recv->partner);
  lock.unlock();
  std::string error;
  try {
    const int64_t bytes = recv->count * static_cast<int64_t>(dtype_size(recv->dtype));
    group.link(send->source, recv->destination, bytes);
    if (bytes > 0) std::memcpy(recv->recv_buffer, send->send_buffer, static_cast<size_t>(bytes));
  } catch (const std::exception& e) {
    error = e.what();
  }
  lock.lock();
  for (P2PRequest* r : {send.get(), recv.get()}) {
    r->state = error.empty() ? P2PRequest::State::Done : P2PRequest::State::Failed;
    if (!error.empty()) r->error = p2p_where(group, *r) + "the copy failed: " + error;
  }
  p2p.cv.notify_all();
}

class P2PWork final : public Work {
 public:
  P2PWork(std::shared_ptr<Group> group, std::shared_ptr<P2PRequest> request)
      : group_(std::move(group)), request_(std::move(request)) {}

  // Times out only while unmatched: once matched, the receiver's copy thread finishes it.
  void wait() override {
    const int self = request_->is_send ? request_->source : request_->destination;
    activity::Scope waiting(group_->world_ranks()[self], request_->is_send ? "send" : "recv", group_->name(),
                            static_cast<int64_t>(request_->index));  // for heartbeats
    P2PState& p2p = group_->p2p();
    const auto timeout = group_->world().timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock lock(p2p.mutex);
    while (unfinished()) {
      if (request_->state == P2PRequest::State::Matched) {
        // A receiver that waits copies its own message rather than waiting for its copy thread
        // to be scheduled (on a busy machine that costs a time slice per message).
        auto& queue = p2p.copies[request_->destination];
        auto queued = std::find(queue.begin(), queue.end(), request_);
        if (!request_->is_send && queued != queue.end()) {
          queue.erase(queued);
          copy_matched(*group_, request_, lock);
        } else {
          p2p.cv.wait(lock);
        }
        continue;
      }
      check_posted_locked();
      if (!unfinished()) break;
      if (p2p.cv.wait_until(lock, deadline) == std::cv_status::timeout &&
          request_->state == P2PRequest::State::Posted) {
        const int peer = request_->is_send ? request_->destination : request_->source;
        cancel_locked(*group_, *request_,
                      "timed out after " + std::to_string(timeout.count()) + " ms: " + group_->describe_ranks({peer}) +
                          " never posted the matching " + (request_->is_send ? "recv" : "send") +
                          ". Sends and recvs match on (source, destination, tag) in issue order; if the peer is "
                          "only slow, raise runtime.timeout_s");
      }
    }
    if (request_->state == P2PRequest::State::Failed) throw Error(request_->error);
  }

  bool test() override {
    std::lock_guard lock(group_->p2p().mutex);
    if (request_->state == P2PRequest::State::Posted) check_posted_locked();
    if (request_->state == P2PRequest::State::Failed) throw Error(request_->error);
    return request_->state == P2PRequest::State::Done;
  }

 private:
  bool unfinished() const {
    return request_->state == P2PRequest::State::Posted || request_->state == P2PRequest::State::Matched;
  }

  // An unmatched request fails at once when the world aborted or the peer left the group.
  void check_posted_locked() {
    const int peer = request_->is_send ? request_->destination : request_->source;
    if (group_->world().aborted()) {
      cancel_locked(*group_, *request_, "aborted because " + group_->world().abort_reason());
    } else if (group_->departed(peer)) {
      cancel_locked(*group_, *request_,
                    group_->describe_ranks({peer}) + " left the group (its Communicator was destroyed) without " +
                        "posting the matching " + (request_->is_send ? "recv" : "send"));
    }
  }

  std::shared_ptr<Group> group_;
  std::shared_ptr<P2PRequest> request_;
};

class ThreadsCommunicator final : public Communicator {
 public:
  ThreadsCommunicator(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  ThreadsCommunicator(const ThreadsCommunicator&) = delete;
  ThreadsCommunicator& operator=(const ThreadsCommunicator&) = delete;

  // Runs what is queued (waits inside time out, or fail at once after an abort), settles this
  // rank's messages, then tells the other ranks it is gone.
  ~ThreadsCommunicator() override {
    {
      std::lock_guard lock(queue_->mutex);
      queue_->stopping = true;
    }
    queue_->cv.notify_all();
    if (progress_.joinable()) progress_.join();
    settle_messages();
    group_->depart(rank_);
  }

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const std::string& name() const override { return group_->name(); }
  const std::vector<int>& world_ranks() const override { return group_->world_ranks(); }
  std::string backend() const override { return "threads"; }

  WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    require_valid(CollectiveCall::all_reduce(data, count, dtype, op));
    return submit([=, this](uint64_t seq) { threads::all_reduce(call(seq), data, count, dtype, op); });
  }

  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                  ReduceOp op) override {
    require_valid(CollectiveCall::reduce_scatter(send, recv, recv_count, dtype, op));
    return submit([=, this](uint64_t seq) { threads::reduce_scatter(call(seq), send, recv, recv_count, dtype, op); });
  }

  WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    require_valid(CollectiveCall::all_gather(send, recv, send_count, dtype));
    return submit([=, this](uint64_t seq) { threads::all_gather(call(seq), send, recv, send_count, dtype); });
  }

  WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                DType dtype) override {
    CollectiveCall args = CollectiveCall::all_gather_v(send, recv, counts, dtype);
    require_valid(args);
    // The call owns a copy of the counts: the caller's span may not outlive this call.
    return submit([=, this, owned = std::move(args.counts)](uint64_t seq) {
      threads::all_gather_v(call(seq), send, recv, owned, dtype);
    });
  }

  WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    require_valid(CollectiveCall::broadcast(data, count, dtype, root));
    return submit([=, this](uint64_t seq) { threads::broadcast(call(seq), data, count, dtype, root); });
  }

  WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) override {
    require_valid(CollectiveCall::reduce(send, recv, count, dtype, op, root));
    return submit([=, this](uint64_t seq) { threads::reduce(call(seq), send, recv, count, dtype, op, root); });
  }

  // The all-to-alls read other ranks' send while writing this rank's recv: no in-place form.
  WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    require_valid(CollectiveCall::all_to_all(send, recv, count, dtype), /*disjoint=*/true);
    return submit([=, this](uint64_t seq) { threads::all_to_all(call(seq), send, recv, count, dtype); });
  }

  WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                std::span<const int64_t> recv_counts, DType dtype) override {
    CollectiveCall args = CollectiveCall::all_to_all_v(send, send_counts, recv, recv_counts, dtype);
    require_valid(args, /*disjoint=*/true);
    return submit([=, this, sends = std::move(args.counts), recvs = std::move(args.recv_counts)](uint64_t seq) {
      threads::all_to_all_v(call(seq), send, sends, recv, recvs, dtype);
    });
  }

  WorkHandle barrier_async() override {
    return submit([this](uint64_t seq) { threads::barrier(call(seq)); });
  }

  WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return post_message(true, const_cast<void*>(data), count, dtype, peer, tag);
  }

  WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return post_message(false, data, count, dtype, peer, tag);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    require_valid(CollectiveCall::split(color, key, name));
    auto result = std::make_shared<SplitResult>();
    submit([=, this](uint64_t seq) { *result = threads::split(call(seq), color, key, name); })->wait();
    if (!result->group) return nullptr;
    return std::make_unique<ThreadsCommunicator>(result->group, result->rank);
  }

 private:
  Call call(uint64_t seq) { return Call{*group_, rank_, seq}; }

  std::string where(const std::string& kind) {
    std::lock_guard lock(queue_->mutex);
    return group_->where(rank_, next_seq_, kind);
  }

  // Throws, naming the operation, when the arguments of `args` are invalid (the shared rules of
  // arguments.h; `disjoint`: send and recv must not overlap either).
  void require_valid(const CollectiveCall& args, bool disjoint = false) {
    std::string problem = argument_problem(args, rank_, size());
    if (problem.empty() && disjoint) problem = overlap_problem(args, size());
    if (!problem.empty()) throw Error(where(collective_name(args.kind)) + problem);
  }

  WorkHandle submit(std::function<void(uint64_t)> body) {
    auto op = std::make_shared<Op>();
    {
      std::lock_guard lock(queue_->mutex);
      const uint64_t seq = next_seq_++;
      op->run = [body = std::move(body), seq] { body(seq); };
      queue_->ops.push_back(op);
      if (!progress_.joinable()) progress_ = std::thread([this] { progress_loop(); });
    }
    queue_->cv.notify_all();
    return std::make_shared<OpWork>(queue_, op);
  }

  void progress_loop() {
    Queue& q = *queue_;
    std::unique_lock lock(q.mutex);
    for (;;) {
      q.cv.wait(lock, [&] { return (!q.ops.empty() || q.stopping) && !q.executing; });
      if (q.ops.empty()) return;  // stopping, and everything queued has run
      q.run_front(lock);
    }
  }

  WorkHandle post_message(bool is_send, void* data, int64_t count, DType dtype, int peer, int tag) {
    const std::string kind = is_send ? "send" : "recv";
    if (std::string problem = message_problem(data, count, peer, tag, rank_, size(), MessageLimits{}); !problem.empty()) {
      throw Error(where(kind) + problem);
    }
    auto request = std::make_shared<P2PRequest>();
    request->is_send = is_send;
    request->source = is_send ? rank_ : peer;
    request->destination = is_send ? peer : rank_;
    request->tag = tag;
    request->count = count;
    request->dtype = dtype;
    if (is_send) {
      request->send_buffer = data;
    } else {
      request->recv_buffer = data;
    }

    P2PState& p2p = group_->p2p();
    if (!is_send) start_copier();
    std::lock_guard lock(p2p.mutex);
    const P2PState::Key key{request->source, request->destination, tag};
    request->index = (is_send ? sent_ : received_)[key]++;
    if (group_->world().aborted()) {
      throw Error(p2p_where(*group_, *request) + "aborted because " + group_->world().abort_reason());
    }
    auto& others = is_send ? p2p.recvs : p2p.sends;
    auto it = others.find(key);
    if (it != others.end()) {
      std::shared_ptr<P2PRequest> other = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) others.erase(it);
      if (is_send) {
        match_locked(*group_, request, other);
      } else {
        match_locked(*group_, other, request);
      }
    } else {
      (is_send ? p2p.sends : p2p.recvs)[key].push_back(request);
    }
    std::erase_if(outstanding_, [](const std::weak_ptr<P2PRequest>& weak) {
      auto r = weak.lock();
      return !r || r->state == P2PRequest::State::Done || r->state == P2PRequest::State::Failed;
    });
    outstanding_.push_back(request);
    return std::make_shared<P2PWork>(group_, std::move(request));
  }

  void start_copier() {
    std::lock_guard lock(group_->p2p().mutex);
    if (!copier_.joinable()) copier_ = std::thread([this] { copier_loop(); });
  }

  // Copies the messages this rank receives, in the order they were matched.
  void copier_loop() {
    P2PState& p2p = group_->p2p();
    std::unique_lock lock(p2p.mutex);
    for (;;) {
      p2p.cv.wait(lock, [&] { return !p2p.copies[rank_].empty() || copier_stop_; });
      if (p2p.copies[rank_].empty()) return;
      std::shared_ptr<P2PRequest> recv = std::move(p2p.copies[rank_].front());
      p2p.copies[rank_].pop_front();
      copy_matched(*group_, recv, lock);
    }
  }

  // Fails this rank's unmatched messages, waits for its matched ones, stops its copy thread.
  void settle_messages() {
    P2PState& p2p = group_->p2p();
    std::unique_lock lock(p2p.mutex);
    for (const auto& weak : outstanding_) {
      if (auto request = weak.lock(); request && request->state == P2PRequest::State::Posted) {
        cancel_locked(*group_, *request, "its communicator was destroyed before the message was matched");
      }
    }
    p2p.cv.wait(lock, [&] {
      return std::none_of(outstanding_.begin(), outstanding_.end(), [](const std::weak_ptr<P2PRequest>& weak) {
        auto r = weak.lock();
        return r && r->state == P2PRequest::State::Matched;
      });
    });
    copier_stop_ = true;
    p2p.cv.notify_all();
    lock.unlock();
    if (copier_.joinable()) copier_.join();
  }

  std::shared_ptr<Group> group_;
  const int rank_;

  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();  // shared with the handles
  uint64_t next_seq_ = 0;                                     // under queue_->mutex
  std::thread progress_;

  // Under the group's p2p mutex.
  std::map<P2PState::Key, uint64_t> sent_, received_;
  std::vector<std::weak_ptr<P2PRequest>> outstanding_;
  bool copier_stop_ = false;
  std::thread copier_;
};

}  // namespace
}  // namespace threads

namespace {

// Which rank threads have returned, for a launcher that must not wait forever for a rank stuck
// outside a collective once another has failed.
struct RankExits {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> exited;
  int count = 0;
};

// After a rank failed, how long the others get to notice (their collectives fail at once; a rank
// computing reaches its next one) before they are abandoned.
std::chrono::milliseconds abandon_grace(const CommOptions& options) {
  return std::min<std::chrono::milliseconds>(options.timeout, std::chrono::seconds(2));
}

// Joins every rank; when one has failed and another has not returned within `grace` after that,
// the ones still running are abandoned (detached) and AbandonedRanks names them with the failure.
void wait_for_ranks(std::vector<std::thread>& ranks, threads::World& world, RankExits& exits,
                    std::chrono::milliseconds grace) {
  const int total = static_cast<int>(ranks.size());
  bool abandon = false;
  {
    std::unique_lock<std::mutex> lock(exits.mutex);
    while (exits.count < total) {
      if (world.aborted()) {
        abandon = !exits.changed.wait_for(lock, grace, [&] { return exits.count == total; });
        break;
      }
      exits.changed.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  if (!abandon) {
    for (auto& t : ranks) t.join();
    if (auto error = world.first_error()) std::rethrow_exception(error);
    return;
  }
  std::string stuck;
  {
    std::lock_guard<std::mutex> lock(exits.mutex);
    for (int r = 0; r < total; ++r) {
      if (exits.exited[static_cast<size_t>(r)]) continue;
      stuck += (stuck.empty() ? "" : ", ") + std::to_string(r);
    }
  }
  for (auto& t : ranks) t.detach();  // the finished ones are done; the others cannot be stopped
  const std::string failure = describe_exception(world.first_error());
  throw AbandonedRanks(failure + "\n(rank(s) " + stuck + " did not stop within " +
                       std::to_string(grace.count() / 1000.0).substr(0, 4) +
                       " s of that failure: busy or stuck outside a collective; the job ends without them)");
}

}  // namespace

void run_threads(const LaunchOptions& options, const std::function<void(Communicator& world)>& body) {
  LOOM_CHECK(options.ranks >= 1,
        "runtime.ranks must be at least 1 for the threads backend (got " + std::to_string(options.ranks) + ")");
  LOOM_CHECK(options.comm.timeout.count() > 0, "runtime.timeout_s must be positive (got " +
                                              std::to_string(options.comm.timeout.count()) + " ms)");
  auto world = std::make_shared<threads::World>(options.ranks, options.comm, options.link_model);
  std::vector<int> members(options.ranks);
  std::iota(members.begin(), members.end(), 0);
  auto group = threads::Group::create(world, "world", members);
  // Owned by the threads too: an abandoned rank may outlive this call.
  auto job = std::make_shared<const std::function<void(Communicator&)>>(body);
  auto exits = std::make_shared<RankExits>();
  exits->exited.assign(static_cast<size_t>(options.ranks), false);

  std::vector<std::thread> ranks;
  ranks.reserve(options.ranks);
  try {
    for (int r = 0; r < options.ranks; ++r) {
      ranks.emplace_back([world, group, job, exits, r] {
        // A compute queue per rank (core/compute_queue.h): ranks sharing a GPU run side by side;
        // the rank's work is done before its thread ends, so whoever joins it may read the results.
        ComputeQueueScope queue(r + 1);
        try {
          threads::ThreadsCommunicator comm(group, r);
          try {
            (*job)(comm);
            synchronize_devices();
          } catch (...) {
            world->fail(r, std::current_exception());  // before `comm` drains: its queued ops then fail fast
            try {
              synchronize_devices();  // what the rank queued still touches memory others may free
            } catch (...) {
              // the device failed too: the rank's own error above is the one reported
            }
          }
        } catch (...) {
          world->fail(r, std::current_exception());
        }
        std::lock_guard<std::mutex> lock(exits->mutex);
        exits->exited[static_cast<size_t>(r)] = true;
        ++exits->count;
        exits->changed.notify_all();
      });
    }
  } catch (...) {  // could not start a thread: stop the ones running
    world->fail(static_cast<int>(ranks.size()), std::current_exception());
    for (auto& t : ranks) t.join();
    throw;
  }
  wait_for_ranks(ranks, *world, *exits, abandon_grace(options.comm));
}

}  // namespace loom::comm
