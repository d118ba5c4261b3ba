#pragma once
// A Communicator with NCCL's point-to-point semantics over another group (the threads backend),
// so that CPU tests catch what would deadlock or mismatch under NCCL. Test support only.
// - One operation at a time: this rank's operations run in issue order, each to completion
//   before the next starts (NCCL runs a communicator's operations one after another on its
//   stream); the *_async calls return at once and the handle waits for the operation's turn.
// - Rendezvous: a send completes only when the peer runs the matching recv (NCCL without its
//   eager buffer: the case of large messages). The wrapped threads backend's send already waits
//   for the recv; serialising makes a rank that waits in a send post nothing else meanwhile.
// - No tags: every message goes with tag 0, so the messages between two ranks match in issue
//   order whatever tags the caller gave.
// exchange_async runs its batch as one operation (the wrapped group's exchange, whose sends and
// recvs progress together), as NCCL runs a group. A deadlock ends in the wrapped group's timeout
// (CommOptions::timeout): a send "never posted the matching recv".
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::testing {

class RendezvousCommunicator final : public comm::Communicator {
 public:
  explicit RendezvousCommunicator(std::unique_ptr<comm::Communicator> inner)
      : inner_(std::move(inner)), state_(std::make_shared<State>()), worker_([this] { run(); }) {}
  // Runs what is queued, then stops.
  ~RendezvousCommunicator() override {
    {
      std::lock_guard lock(state_->mutex);
      state_->stopping = true;
    }
    state_->cv.notify_all();
    worker_.join();
  }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  std::string backend() const override { return "rendezvous(" + inner_->backend() + ")"; }

  comm::WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, comm::ReduceOp op) override {
    return queue([=, this] { return inner_->all_reduce_async(data, count, dtype, op); });
  }
  comm::WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                        comm::ReduceOp op) override {
    return queue([=, this] { return inner_->reduce_scatter_async(send, recv, recv_count, dtype, op); });
  }
  comm::WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return queue([=, this] { return inner_->all_gather_async(send, recv, send_count, dtype); });
  }
  comm::WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                      DType dtype) override {
    return queue([=, this, counts = std::vector<int64_t>(counts.begin(), counts.end())] {
      return inner_->all_gather_v_async(send, recv, counts, dtype);
    });
  }
  comm::WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    return queue([=, this] { return inner_->broadcast_async(data, count, dtype, root); });
  }
  comm::WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                                int root) override {
    return queue([=, this] { return inner_->reduce_async(send, recv, count, dtype, op, root); });
  }
  comm::WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    return queue([=, this] { return inner_->all_to_all_async(send, recv, count, dtype); });
  }
  comm::WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                      std::span<const int64_t> recv_counts, DType dtype) override {
    return queue([=, this, sends = std::vector<int64_t>(send_counts.begin(), send_counts.end()),
                  recvs = std::vector<int64_t>(recv_counts.begin(), recv_counts.end())] {
      return inner_->all_to_all_v_async(send, sends, recv, recvs, dtype);
    });
  }
  comm::WorkHandle barrier_async() override {
    return queue([this] { return inner_->barrier_async(); });
  }
  comm::WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int /*tag*/) override {
    return queue([=, this] { return inner_->send_async(data, count, dtype, peer, 0); });
  }
  comm::WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int /*tag*/) override {
    return queue([=, this] { return inner_->recv_async(data, count, dtype, peer, 0); });
  }
  // One operation: every handle completes with the whole batch (an NCCL group's one event).
  std::vector<comm::WorkHandle> exchange_async(std::span<const comm::PeerOp> ops) override {
    std::vector<comm::PeerOp> untagged(ops.begin(), ops.end());
    for (comm::PeerOp& op : untagged) op.tag = 0;
    comm::WorkHandle batch =
        queue([this, untagged = std::move(untagged)] { return comm::all_of(inner_->exchange_async(untagged)); });
    return std::vector<comm::WorkHandle>(ops.size(), batch);
  }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override {
    std::unique_ptr<comm::Communicator> group;
    queue([&] {
      group = inner_->split(color, key, name);
      return comm::WorkHandle{};
    })->wait();
    return group ? std::make_unique<RendezvousCommunicator>(std::move(group)) : nullptr;
  }

 private:
  struct Task {
    std::function<comm::WorkHandle()> start;
    bool done = false;
    std::exception_ptr error;
  };
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<std::shared_ptr<Task>> tasks;
    bool stopping = false;
  };
  class TaskWork final : public comm::Work {
   public:
    TaskWork(std::shared_ptr<State> state, std::shared_ptr<Task> task) : state_(std::move(state)), task_(std::move(task)) {}
    void wait() override {
      std::unique_lock lock(state_->mutex);
      state_->cv.wait(lock, [&] { return task_->done; });
      if (task_->error) std::rethrow_exception(task_->error);
    }
    bool test() override {
      std::lock_guard lock(state_->mutex);
      if (task_->done && task_->error) std::rethrow_exception(task_->error);
      return task_->done;
    }

   private:
    std::shared_ptr<State> state_;
    std::shared_ptr<Task> task_;
  };

  comm::WorkHandle queue(std::function<comm::WorkHandle()> start) {
    auto task = std::make_shared<Task>();
    task->start = std::move(start);
    {
      std::lock_guard lock(state_->mutex);
      state_->tasks.push_back(task);
    }
    state_->cv.notify_all();
    return std::make_shared<TaskWork>(state_, task);
  }

  // The operations, one at a time: each started and waited for before the next.
  void run() {
    State& s = *state_;
    std::unique_lock lock(s.mutex);
    for (;;) {
      s.cv.wait(lock, [&] { return s.stopping || !s.tasks.empty(); });
      if (s.tasks.empty()) return;
      std::shared_ptr<Task> task = s.tasks.front();
      s.tasks.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        if (comm::WorkHandle work = task->start()) work->wait();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      task->error = error;
      task->done = true;
      s.cv.notify_all();
    }
  }

  std::unique_ptr<comm::Communicator> inner_;
  std::shared_ptr<State> state_;
  std::thread worker_;  // last: started once the rest is built
};

}  // namespace loom::testing
