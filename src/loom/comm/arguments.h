#pragma once
// The arguments of a Communicator call as every backend receives them, and the one place they
// are checked. A backend builds a CollectiveCall from the interface's arguments, asks
// argument_problem() what is wrong with it, and decides how to report it: the threads backend
// throws at once; the mpi backend carries the problem into its agreement handshake, so that
// every rank of the group fails alike.
#include <climits>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm {

// The collectives of Communicator. The values travel in the mpi backend's agreement descriptor
// (every rank must use the same), so they are fixed and start at 1.
enum class CollectiveKind : int64_t {
  AllReduce = 1,
  ReduceScatter,
  AllGather,
  AllGatherV,
  Broadcast,
  Reduce,
  AllToAll,
  AllToAllV,
  Barrier,
  Split,
};
// "all_reduce", "reduce_scatter", ...
std::string collective_name(CollectiveKind kind);

// One collective call: which operation and the arguments of its Communicator signature. Fields
// an operation does not take keep their defaults.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::Barrier;
  DType dtype = DType::F32;
  ReduceOp reduce_op = ReduceOp::Sum;
  int root = -1;
  const void* send = nullptr;
  void* recv = nullptr;              // in-place operations (all_reduce, broadcast): the data
  int64_t count = 0;                 // the count of the signature (count, recv_count, send_count)
  std::vector<int64_t> counts;       // all_gather_v: counts; all_to_all_v: send_counts
  std::vector<int64_t> recv_counts;  // all_to_all_v
  int color = 0;                     // split
  int key = 0;
  std::string name;

  static CollectiveCall all_reduce(void* data, int64_t count, DType dtype, ReduceOp op);
  static CollectiveCall reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op);
  static CollectiveCall all_gather(const void* send, void* recv, int64_t send_count, DType dtype);
  static CollectiveCall all_gather_v(const void* send, void* recv, std::span<const int64_t> counts, DType dtype);
  static CollectiveCall broadcast(void* data, int64_t count, DType dtype, int root);
  static CollectiveCall reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root);
  static CollectiveCall all_to_all(const void* send, void* recv, int64_t count, DType dtype);
  static CollectiveCall all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                                     std::span<const int64_t> recv_counts, DType dtype);
  static CollectiveCall barrier();
  static CollectiveCall split(int color, int key, const std::string& name);
};

// The first thing wrong with `call` on rank `rank` of a group of `size` ranks, or "" when its
// arguments are valid: counts >= 0, buffers non-null where they hold elements, a reducible dtype
// and a known reduce op for reductions, a root inside the group, one count per rank for the `v`
// forms, a name for a group that split() creates. Messages name the argument, e.g.
// "recv_count must be >= 0 (got -2)" or "root 4 is not a rank of the group (0..3)". Cheap when
// the arguments are valid: messages are built only for failed checks.
std::string argument_problem(const CollectiveCall& call, int rank, int size);

// For backends whose all-to-alls read the peers' send buffers while writing recv (no in-place
// form): "" unless send and recv of an all_to_all(_v) on a group of `size` ranks overlap.
std::string overlap_problem(const CollectiveCall& call, int size);

// What a backend allows of send/recv beyond the interface's rules.
struct MessageLimits {
  int max_tag = INT_MAX;  // tags run 0..max_tag
  const char* max_tag_name = "INT_MAX";
  bool to_self = true;  // whether a rank may name itself as the peer
};

// The first thing wrong with a send or recv of `count` elements at `data` between this rank
// (`rank` of `size`) and `peer` with `tag`, or "".
std::string message_problem(const void* data, int64_t count, int peer, int tag, int rank, int size,
                            const MessageLimits& limits);

}  // namespace loom::comm
