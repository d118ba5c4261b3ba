#include "loom/plan/shape_group.h"

#include "loom/core/error.h"

namespace loom::plan {

namespace {
[[noreturn]] void refuse(const char* what) {
  throw Error(std::string("a shapes-only group (memory planning) moves no data: ") + what + " is not available");
}
}  // namespace

ShapeGroup::ShapeGroup(int size, int rank) : size_(size), rank_(rank), ranks_(static_cast<size_t>(size)) {
  LOOM_CHECK(size >= 1 && rank >= 0 && rank < size,
             "ShapeGroup: rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks");
  for (int r = 0; r < size; ++r) ranks_[static_cast<size_t>(r)] = r;
}

comm::WorkHandle ShapeGroup::all_reduce_async(void*, int64_t, DType, comm::ReduceOp) { refuse("all_reduce"); }
comm::WorkHandle ShapeGroup::reduce_scatter_async(const void*, void*, int64_t, DType, comm::ReduceOp) {
  refuse("reduce_scatter");
}
comm::WorkHandle ShapeGroup::all_gather_async(const void*, void*, int64_t, DType) { refuse("all_gather"); }
comm::WorkHandle ShapeGroup::all_gather_v_async(const void*, void*, std::span<const int64_t>, DType) {
  refuse("all_gather_v");
}
comm::WorkHandle ShapeGroup::broadcast_async(void*, int64_t, DType, int) { refuse("broadcast"); }
comm::WorkHandle ShapeGroup::reduce_async(const void*, void*, int64_t, DType, comm::ReduceOp, int) { refuse("reduce"); }
comm::WorkHandle ShapeGroup::all_to_all_async(const void*, void*, int64_t, DType) { refuse("all_to_all"); }
comm::WorkHandle ShapeGroup::all_to_all_v_async(const void*, std::span<const int64_t>, void*,
                                                std::span<const int64_t>, DType) {
  refuse("all_to_all_v");
}
comm::WorkHandle ShapeGroup::barrier_async() { refuse("barrier"); }
comm::WorkHandle ShapeGroup::send_async(const void*, int64_t, DType, int, int) { refuse("send"); }
comm::WorkHandle ShapeGroup::recv_async(void*, int64_t, DType, int, int) { refuse("recv"); }
std::vector<comm::WorkHandle> ShapeGroup::exchange_async(std::span<const comm::PeerOp>) { refuse("exchange"); }
std::unique_ptr<comm::Communicator> ShapeGroup::split(int, int, const std::string&) { refuse("split"); }

}  // namespace loom::plan
