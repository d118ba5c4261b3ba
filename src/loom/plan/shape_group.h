#pragma once
// A stand-in communicator that only knows its size and this rank's place in it: the model's
// registration pass asks a tensor-parallel group for nothing else, so building a model on a
// shapes-only store with this group gives one tensor-parallel rank's parameters of any layout
// without starting ranks. Moving data through it is an Error.
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::plan {

class ShapeGroup final : public comm::Communicator {
 public:
  ShapeGroup(int size, int rank);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return ranks_; }
  std::string backend() const override { return "shapes"; }

  comm::WorkHandle all_reduce_async(void*, int64_t, DType, comm::ReduceOp) override;
  comm::WorkHandle reduce_scatter_async(const void*, void*, int64_t, DType, comm::ReduceOp) override;
  comm::WorkHandle all_gather_async(const void*, void*, int64_t, DType) override;
  comm::WorkHandle all_gather_v_async(const void*, void*, std::span<const int64_t>, DType) override;
  comm::WorkHandle broadcast_async(void*, int64_t, DType, int) override;
  comm::WorkHandle reduce_async(const void*, void*, int64_t, DType, comm::ReduceOp, int) override;
  comm::WorkHandle all_to_all_async(const void*, void*, int64_t, DType) override;
  comm::WorkHandle all_to_all_v_async(const void*, std::span<const int64_t>, void*, std::span<const int64_t>,
                                      DType) override;
  comm::WorkHandle barrier_async() override;
  comm::WorkHandle send_async(const void*, int64_t, DType, int, int) override;
  comm::WorkHandle recv_async(void*, int64_t, DType, int, int) override;
  std::vector<comm::WorkHandle> exchange_async(std::span<const comm::PeerOp>) override;
  std::unique_ptr<comm::Communicator> split(int, int, const std::string&) override;

 private:
  int size_, rank_;
  std::string name_ = "shapes";
  std::vector<int> ranks_;
};

}  // namespace loom::plan
