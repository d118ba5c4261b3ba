// Phase 2 of the mpi backend's collectives: the data moves with MPI's blocking collectives.
//
// - Reductions: f32 goes to MPI as MPI_FLOAT with MPI_SUM / MPI_MAX. bf16 and f16 are widened to
//   an f32 scratch buffer, reduced there by MPI in f32 and rounded to the dtype once at the end
//   (reduce.h's to_f32 / finish), which keeps the "accumulate in f32, round once" rule exactly; a
//   user-defined MPI_Op on 16-bit data would round at every step of MPI's reduction tree. Avg is
//   a Sum divided by the group size before that final rounding.
// - Counts: MPI takes int counts, so an operation is split into calls of at most
//   CollectiveOp::max_elements elements. Where a split would cut across the per-rank blocks of a
//   gather or scatter layout, the operation becomes one rooted call per rank (MPI_Reduce /
//   MPI_Bcast); all-to-all-v, whose sizes differ per rank, always runs as posted point-to-point
//   messages on the collective communicator, so every rank takes the same path.
// - Overlapping send and receive buffers (MPI forbids aliasing) are handled with MPI_IN_PLACE
//   where the layout is MPI's in-place one, or by copying the send side to scratch first.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loom/comm/mpi/transfer.h"
#include "loom/comm/reduce.h"

namespace loom::comm::mpi_detail {

namespace {

// MPI's blocking all-to-all-v runs on the collective communicator with this tag; no other
// point-to-point traffic uses that communicator.
constexpr int kAllToAllTag = 1;

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0 || a == nullptr || b == nullptr) return false;
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y + b_bytes && y < x + a_bytes;
}

template <typename F>
void for_chunks(int64_t count, int64_t limit, F&& f) {
  for (int64_t offset = 0; offset < count; offset += limit) f(offset, static_cast<int>(std::min(limit, count - offset)));
}

std::vector<int64_t> prefix(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displs(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
  return displs;
}

struct Context {
  Context(Group& g, CollectiveOp& o)
      : comm(g.comm()), rank(g.rank()), size(g.size()), limit(o.max_elements), group(&g), op(&o), call(o.call) {}
  MPI_Comm comm;
  int rank;
  int size;
  int64_t limit;
  Group* group;
  const CollectiveOp* op;
  const CollectiveCall& call;
  // The error message names the group and the operation; built only when a call fails.
  void check(int rc) const {
    mpi_check(rc, [this] { return group->label() + ": " + op->describe(); });
  }
  size_t element() const { return dtype_size(call.dtype); }
  MPI_Datatype type() const { return mpi_type(call.dtype); }
  MPI_Op reduce_op() const { return call.reduce_op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }
  // Reductions: f32 is reduced in place, bf16/f16 staged through f32 scratch.
  bool wide() const { return call.dtype == DType::F32; }
};

std::byte* bytes(void* p) { return static_cast<std::byte*>(p); }
const std::byte* bytes(const void* p) { return static_cast<const std::byte*>(p); }

// Point-to-point exchange: send_counts[r] elements at send_displs[r] go to r, recv_counts[r]
// arrive from r at recv_displs[r]. Chunk boundaries agree on both sides because the counts do.
void exchange(const Context& c, const void* send, const std::vector<int64_t>& send_counts,
              const std::vector<int64_t>& send_displs, void* recv, const std::vector<int64_t>& recv_counts,
              const std::vector<int64_t>& recv_displs, DType dtype) {
  const size_t element = dtype_size(dtype);
  const MPI_Datatype type = mpi_type(dtype);
  std::vector<MPI_Request> requests;
  for (int step = 0; step < c.size; ++step) {
    // Staggered partners, so that not every rank sends to rank 0 first.
    const int to = (c.rank + step) % c.size;
    const int from = (c.rank - step + c.size) % c.size;
    if (step == 0) {
      const int64_t n = send_counts[static_cast<size_t>(c.rank)];
      if (n > 0) {
        std::memmove(bytes(recv) + recv_displs[static_cast<size_t>(c.rank)] * static_cast<int64_t>(element),
                     bytes(send) + send_displs[static_cast<size_t>(c.rank)] * static_cast<int64_t>(element),
                     static_cast<size_t>(n) * element);
      }
      continue;
    }
    for_chunks(recv_counts[static_cast<size_t>(from)], c.limit, [&](int64_t offset, int n) {
      requests.emplace_back();
      c.check(MPI_Irecv(bytes(recv) + (recv_displs[static_cast<size_t>(from)] + offset) * static_cast<int64_t>(element),
                          n, type, from, kAllToAllTag, c.comm, &requests.back()));
    });
    for_chunks(send_counts[static_cast<size_t>(to)], c.limit, [&](int64_t offset, int n) {
      requests.emplace_back();
      c.check(MPI_Isend(bytes(send) + (send_displs[static_cast<size_t>(to)] + offset) * static_cast<int64_t>(element),
                          n, type, to, kAllToAllTag, c.comm, &requests.back()));
    });
  }
  if (!requests.empty()) {
    c.check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  }
}

}  // namespace

namespace transfer {

void all_reduce(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  if (a.count == 0) return;
  float* acc = static_cast<float*>(a.recv);
  if (!c.wide()) {
    acc = static_cast<float*>(group.scratch(static_cast<size_t>(a.count) * sizeof(float)));
    to_f32(acc, a.recv, a.count, a.dtype);
  }
  for_chunks(a.count, c.limit, [&](int64_t offset, int len) {
    c.check(MPI_Allreduce(MPI_IN_PLACE, acc + offset, len, MPI_FLOAT, c.reduce_op(), c.comm));
  });
  if (!c.wide() || a.reduce_op == ReduceOp::Avg) finish(a.recv, acc, a.count, a.dtype, a.reduce_op, c.size);
}

void reduce_scatter(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  const int n = c.size;
  const int64_t block = a.count;
  const int64_t total = block * n;
  if (block == 0) return;
  const bool one_call = total <= c.limit;
  if (c.wide() && !overlaps(a.send, static_cast<size_t>(total) * 4, a.recv, static_cast<size_t>(block) * 4) &&
      one_call) {
    c.check(MPI_Reduce_scatter_block(a.send, a.recv, static_cast<int>(block), MPI_FLOAT, c.reduce_op(), c.comm));
    if (a.reduce_op == ReduceOp::Avg) finish(a.recv, static_cast<float*>(a.recv), block, a.dtype, a.reduce_op, n);
    return;
  }
  // acc holds the whole send side in f32; MPI_IN_PLACE leaves this rank's block at acc[0]
  // (one call) or at acc[rank * block] (one rooted reduce per block).
  float* acc = static_cast<float*>(group.scratch(static_cast<size_t>(total) * sizeof(float)));
  to_f32(acc, a.send, total, a.dtype);
  float* result = acc;
  if (one_call) {
    c.check(MPI_Reduce_scatter_block(MPI_IN_PLACE, acc, static_cast<int>(block), MPI_FLOAT, c.reduce_op(), c.comm));
  } else {
    for (int root = 0; root < n; ++root) {
      float* part = acc + static_cast<int64_t>(root) * block;
      for_chunks(block, c.limit, [&](int64_t offset, int len) {
        // The receive buffer matters on the root only.
        c.check(MPI_Reduce(root == c.rank ? MPI_IN_PLACE : part + offset, root == c.rank ? part + offset : nullptr,
                           len, MPI_FLOAT, c.reduce_op(), root, c.comm));
      });
    }
    result = acc + static_cast<int64_t>(c.rank) * block;
  }
  finish(a.recv, result, block, a.dtype, a.reduce_op, n);
}

void reduce(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  if (a.count == 0) return;
  const bool root = c.rank == a.root;
  const size_t send_bytes = static_cast<size_t>(a.count) * c.element();
  if (c.wide() && !(root && overlaps(a.send, send_bytes, a.recv, send_bytes) && a.send != a.recv)) {
    // In place when the root passes one buffer for both.
    const bool in_place = root && a.send == a.recv;
    const float* send = static_cast<const float*>(a.send);
    float* recv = static_cast<float*>(a.recv);
    for_chunks(a.count, c.limit, [&](int64_t offset, int len) {
      c.check(MPI_Reduce(in_place ? MPI_IN_PLACE : send + offset, root ? recv + offset : nullptr, len, MPI_FLOAT,
                         c.reduce_op(), a.root, c.comm));
    });
    if (root && a.reduce_op == ReduceOp::Avg) finish(recv, recv, a.count, a.dtype, a.reduce_op, c.size);
    return;
  }
  float* acc = static_cast<float*>(group.scratch(static_cast<size_t>(a.count) * sizeof(float)));
  to_f32(acc, a.send, a.count, a.dtype);
  for_chunks(a.count, c.limit, [&](int64_t offset, int len) {
    c.check(MPI_Reduce(root ? MPI_IN_PLACE : acc + offset, root ? acc + offset : nullptr, len, MPI_FLOAT,
                       c.reduce_op(), a.root, c.comm));
  });
  if (root) finish(a.recv, acc, a.count, a.dtype, a.reduce_op, c.size);
}

void all_gather(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  const bool equal = a.kind == CollectiveKind::AllGather;
  const size_t element = c.element();
  const MPI_Datatype type = c.type();
  const std::vector<int64_t> counts = equal ? std::vector<int64_t>(static_cast<size_t>(c.size), a.count) : a.counts;
  const std::vector<int64_t> displs = prefix(counts);
  const int64_t total = displs.back() + counts.back();
  if (total == 0) return;
  const int64_t mine = counts[static_cast<size_t>(c.rank)];
  std::byte* own = bytes(a.recv) + displs[static_cast<size_t>(c.rank)] * static_cast<int64_t>(element);
  // Put this rank's block in place first when it is not already there: then MPI's in-place
  // form applies, whatever the send buffer overlaps.
  if (mine > 0 && a.send != own) std::memmove(own, a.send, static_cast<size_t>(mine) * element);
  if (total <= c.limit) {
    std::vector<int> icounts(counts.begin(), counts.end());
    std::vector<int> idispls(displs.begin(), displs.end());
    if (equal) {
      c.check(MPI_Allgather(MPI_IN_PLACE, 0, type, a.recv, static_cast<int>(a.count), type, c.comm));
    } else {
      c.check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, a.recv, icounts.data(), idispls.data(), type, c.comm));
    }
    return;
  }
  for (int root = 0; root < c.size; ++root) {
    std::byte* part = bytes(a.recv) + displs[static_cast<size_t>(root)] * static_cast<int64_t>(element);
    for_chunks(counts[static_cast<size_t>(root)], c.limit, [&](int64_t offset, int len) {
      c.check(MPI_Bcast(part + offset * static_cast<int64_t>(element), len, type, root, c.comm));
    });
  }
}

void broadcast(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  for_chunks(a.count, c.limit, [&](int64_t offset, int len) {
    c.check(MPI_Bcast(bytes(a.recv) + offset * static_cast<int64_t>(c.element()), len, c.type(), a.root, c.comm));
  });
}

void all_to_all(Group& group, CollectiveOp& op) {
  const Context c(group, op);
  const CollectiveCall& a = c.call;
  const bool equal = a.kind == CollectiveKind::AllToAll;
  const size_t element = c.element();
  std::vector<int64_t> send_counts = a.counts;
  std::vector<int64_t> recv_counts = a.recv_counts;
  if (equal) {
    send_counts.assign(static_cast<size_t>(c.size), a.count);
    recv_counts = send_counts;
  }
  const std::vector<int64_t> send_displs = prefix(send_counts);
  const std::vector<int64_t> recv_displs = prefix(recv_counts);
  const int64_t send_total = send_displs.back() + send_counts.back();
  const int64_t recv_total = recv_displs.back() + recv_counts.back();
  const void* send = a.send;
  if (overlaps(send, static_cast<size_t>(send_total) * element, a.recv, static_cast<size_t>(recv_total) * element)) {
    void* copy = group.scratch(static_cast<size_t>(send_total) * element);
    std::memcpy(copy, send, static_cast<size_t>(send_total) * element);
    send = copy;
  }
  if (equal) {
    if (a.count == 0) return;
    if (a.count * c.size <= c.limit) {
      c.check(MPI_Alltoall(send, static_cast<int>(a.count), c.type(), a.recv, static_cast<int>(a.count), c.type(),
                           c.comm));
      return;
    }
  }
  exchange(c, send, send_counts, send_displs, a.recv, recv_counts, recv_displs, a.dtype);
}

void barrier(Group& group, CollectiveOp& op) {
  // With the agreement handshake every rank has already arrived.
  if (!op.check_agreement) Context(group, op).check(MPI_Barrier(group.comm()));
}

}  // namespace transfer

}  // namespace loom::comm::mpi_detail
