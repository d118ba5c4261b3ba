#pragma once
// Internal to the threads backend: the shared-memory algorithm of every collective. Each runs on
// the progress thread of one rank (threads/backend.cpp) as operation `seq` of its group; the
// arguments were checked by the caller. They throw loom::Error on timeout, abort or ranks that
// disagree (see Group::arrive).
#include <cstdint>
#include <span>
#include <string>

#include "loom/comm/threads/group.h"

namespace loom::comm::threads {

// Per-rank inputs up to this many bytes are copied into the slot (one rendezvous, no closing
// barrier); larger ones are read in place. Also the all-reduce switch from latency-optimal
// (every rank reduces everything) to bandwidth-optimal (reduce-scatter + all-gather).
inline constexpr int64_t kStageBytes = 64 << 10;
// Bytes of each rank's slice in one chunk of a large all-reduce: chunk = size * this.
inline constexpr int64_t kSliceBytes = 128 << 10;

struct Call {
  Group& group;
  int rank;
  uint64_t seq;
};

void all_reduce(const Call& call, void* data, int64_t count, DType dtype, ReduceOp op);
void reduce_scatter(const Call& call, const void* send, void* recv, int64_t recv_count, DType dtype, ReduceOp op);
void all_gather(const Call& call, const void* send, void* recv, int64_t send_count, DType dtype);
void all_gather_v(const Call& call, const void* send, void* recv, std::span<const int64_t> counts, DType dtype);
void broadcast(const Call& call, void* data, int64_t count, DType dtype, int root);
void reduce(const Call& call, const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root);
void all_to_all(const Call& call, const void* send, void* recv, int64_t count, DType dtype);
void all_to_all_v(const Call& call, const void* send, std::span<const int64_t> send_counts, void* recv,
                  std::span<const int64_t> recv_counts, DType dtype);
void barrier(const Call& call);
SplitResult split(const Call& call, int color, int key, const std::string& name);

}  // namespace loom::comm::threads
