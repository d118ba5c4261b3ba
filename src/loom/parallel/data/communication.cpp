#include "loom/parallel/data/communication.h"

#include <bit>
#include <cstdint>
#include <vector>

namespace loom::parallel {

comm::WorkHandle start_gradient_all_reduce(comm::Communicator& group, void* bucket, int64_t count, DType wire,
                                           comm::ReduceOp op) {
  return group.all_reduce_async(bucket, count, wire, op);
}

comm::WorkHandle start_gradient_reduce_scatter(comm::Communicator& group, const void* send, void* recv,
                                               int64_t shard_count, DType wire, comm::ReduceOp op) {
  return group.reduce_scatter_async(send, recv, shard_count, wire, op);
}

comm::WorkHandle start_shard_all_gather(comm::Communicator& group, const void* send, void* recv,
                                        std::span<const int64_t> counts, DType dtype) {
  return group.all_gather_v_async(send, recv, counts, dtype);
}

comm::WorkHandle start_cross_site_all_reduce(comm::Communicator& across, void* shard, int64_t count, DType dtype) {
  return across.all_reduce_async(shard, count, dtype, comm::ReduceOp::Sum);
}

std::unique_ptr<comm::Communicator> split_group(comm::Communicator& group, int color, int key, const std::string& name) {
  return group.split(color, key, name);
}

void average_over_sites(comm::Communicator& across, float* delta, int64_t count) {
  across.all_reduce(delta, count, DType::F32, comm::ReduceOp::Avg);
}

double sum_over_group(comm::Communicator& group, double value) {
  if (group.size() == 1) return value;
  const int64_t mine = std::bit_cast<int64_t>(value);
  std::vector<int64_t> shares(static_cast<size_t>(group.size()));
  group.all_gather(&mine, shares.data(), 1, DType::I64);
  double sum = 0.0;
  for (const int64_t bits : shares) sum += std::bit_cast<double>(bits);
  return sum;
}

void sum_tied_gradient(comm::Communicator& group, float* grad, int64_t numel) {
  group.all_reduce(grad, numel, DType::F32, comm::ReduceOp::Sum);
}

}  // namespace loom::parallel
