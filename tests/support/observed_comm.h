#pragma once
// A Communicator that runs another group's operations and tells a test when each is waited for:
// `on_wait(kind)` ("all_reduce", "reduce_scatter", "all_gather", ...) runs on the waiting thread
// just before the wait, so a test can see what the caller computed between starting an operation
// and needing its result (the overlap of communication with compute). Test support only.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::testing {

class ObservedCommunicator final : public comm::Communicator {
 public:
  using OnWait = std::function<void(const std::string& kind)>;
  ObservedCommunicator(comm::Communicator& inner, OnWait on_wait) : inner_(&inner), on_wait_(std::move(on_wait)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }
  const std::vector<int>& world_ranks() const override { return inner_->world_ranks(); }
  std::string backend() const override { return inner_->backend(); }

  comm::WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, comm::ReduceOp op) override {
    return observed("all_reduce", inner_->all_reduce_async(data, count, dtype, op));
  }
  comm::WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                        comm::ReduceOp op) override {
    return observed("reduce_scatter", inner_->reduce_scatter_async(send, recv, recv_count, dtype, op));
  }
  comm::WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return observed("all_gather", inner_->all_gather_async(send, recv, send_count, dtype));
  }
  comm::WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                      DType dtype) override {
    return observed("all_gather_v", inner_->all_gather_v_async(send, recv, counts, dtype));
  }
  comm::WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    return observed("broadcast", inner_->broadcast_async(data, count, dtype, root));
  }
  comm::WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, comm::ReduceOp op,
                                int root) override {
    return observed("reduce", inner_->reduce_async(send, recv, count, dtype, op, root));
  }
  comm::WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    return observed("all_to_all", inner_->all_to_all_async(send, recv, count, dtype));
  }
  comm::WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                      std::span<const int64_t> recv_counts, DType dtype) override {
    return observed("all_to_all_v", inner_->all_to_all_v_async(send, send_counts, recv, recv_counts, dtype));
  }
  comm::WorkHandle barrier_async() override { return observed("barrier", inner_->barrier_async()); }
  comm::WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int tag) override {
    return observed("send", inner_->send_async(data, count, dtype, peer, tag));
  }
  comm::WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int tag) override {
    return observed("recv", inner_->recv_async(data, count, dtype, peer, tag));
  }
  std::unique_ptr<comm::Communicator> split(int color, int key, const std::string& name) override {
    return inner_->split(color, key, name);  // unobserved
  }

 private:
  class Work final : public comm::Work {
   public:
    Work(std::string kind, comm::WorkHandle inner, const OnWait* on_wait)
        : kind_(std::move(kind)), inner_(std::move(inner)), on_wait_(on_wait) {}
    void wait() override {
      (*on_wait_)(kind_);
      inner_->wait();
    }
    void wait_in_stream() override {
      (*on_wait_)(kind_);
      inner_->wait_in_stream();
    }
    bool test() override { return inner_->test(); }

   private:
    std::string kind_;
    comm::WorkHandle inner_;
    const OnWait* on_wait_;
  };

  comm::WorkHandle observed(const std::string& kind, comm::WorkHandle inner) {
    return std::make_shared<Work>(kind, std::move(inner), &on_wait_);
  }

  comm::Communicator* inner_;
  OnWait on_wait_;
};

}  // namespace loom::testing
