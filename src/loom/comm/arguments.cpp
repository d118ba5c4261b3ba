#include "loom/comm/arguments.h"

#include <cstddef>

#include "loom/comm/reduce.h"

namespace loom::comm {

namespace {

// Keeps the first failed check's message. Messages are built only for failed checks: this runs
// on every collective.
class Checks {
 public:
  template <typename Message>
  void require(bool condition, Message&& message) {
    if (!condition && problem_.empty()) problem_ = message();
  }

  void count(int64_t value, const char* name) {
    require(value >= 0, [&] { return std::string(name) + " must be >= 0 (got " + std::to_string(value) + ")"; });
  }
  void buffer(const void* pointer, int64_t count, const char* name) {
    require(count <= 0 || pointer != nullptr,
            [&] { return std::string(name) + " is null but must hold " + std::to_string(count) + " elements"; });
  }
  void reduction(DType dtype, ReduceOp op) {
    require(reducible(dtype), [&] { return "dtype " + dtype_name(dtype) + " cannot be reduced (valid: f32, bf16, f16)"; });
    require(op == ReduceOp::Sum || op == ReduceOp::Avg || op == ReduceOp::Max, [&] {
      return "unknown reduce op " + std::to_string(static_cast<int>(op)) + " (valid: sum, avg, max)";
    });
  }
  void root(int root, int size) {
    require(root >= 0 && root < size, [&] {
      return "root " + std::to_string(root) + " is not a rank of the group (0.." + std::to_string(size - 1) + ")";
    });
  }
  // One count per rank, none negative. False when the number of entries is wrong.
  bool counts(const std::vector<int64_t>& counts, int size, const char* name) {
    const bool one_per_rank = static_cast<int>(counts.size()) == size;
    require(one_per_rank, [&] {
      return std::string(name) + " has " + std::to_string(counts.size()) + " entries; it needs one per rank (" +
             std::to_string(size) + ")";
    });
    for (size_t i = 0; i < counts.size(); ++i) {
      require(counts[i] >= 0, [&] {
        return std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(counts[i]) + " is negative";
      });
    }
    return one_per_rank;
  }

  std::string take() { return std::move(problem_); }

 private:
  std::string problem_;
};

int64_t sum(const std::vector<int64_t>& counts) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total;
}

CollectiveCall call_of(CollectiveKind kind, DType dtype) {
  CollectiveCall call;
  call.kind = kind;
  call.dtype = dtype;
  return call;
}

}  // namespace

std::string collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::AllGatherV: return "all_gather_v";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Reduce: return "reduce";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::AllToAllV: return "all_to_all_v";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Split: return "split";
  }
  return "operation " + std::to_string(static_cast<int64_t>(kind));
}

CollectiveCall CollectiveCall::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  CollectiveCall c = call_of(CollectiveKind::AllReduce, dtype);
  c.recv = data;
  c.count = count;
  c.reduce_op = op;
  return c;
}

CollectiveCall CollectiveCall::reduce_scatter(const void* send, void* recv, int64_t recv_count, DType dtype,
                                              ReduceOp op) {
  CollectiveCall c = call_of(CollectiveKind::ReduceScatter, dtype);
  c.send = send;
  c.recv = recv;
  c.count = recv_count;
  c.reduce_op = op;
  return c;
}

CollectiveCall CollectiveCall::all_gather(const void* send, void* recv, int64_t send_count, DType dtype) {
  CollectiveCall c = call_of(CollectiveKind::AllGather, dtype);
  c.send = send;
  c.recv = recv;
  c.count = send_count;
  return c;
}

CollectiveCall CollectiveCall::all_gather_v(const void* send, void* recv, std::span<const int64_t> counts,
                                            DType dtype) {
  CollectiveCall c = call_of(CollectiveKind::AllGatherV, dtype);
  c.send = send;
  c.recv = recv;
  c.counts.assign(counts.begin(), counts.end());
  return c;
}

CollectiveCall CollectiveCall::broadcast(void* data, int64_t count, DType dtype, int root) {
  CollectiveCall c = call_of(CollectiveKind::Broadcast, dtype);
  c.recv = data;
  c.count = count;
  c.root = root;
  return c;
}

CollectiveCall CollectiveCall::reduce(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                      int root) {
  CollectiveCall c = call_of(CollectiveKind::Reduce, dtype);
  c.send = send;
  c.recv = recv;
  c.count = count;
  c.reduce_op = op;
  c.root = root;
  return c;
}

CollectiveCall CollectiveCall::all_to_all(const void* send, void* recv, int64_t count, DType dtype) {
  CollectiveCall c = call_of(CollectiveKind::AllToAll, dtype);
  c.send = send;
  c.recv = recv;
  c.count = count;
  return c;
}

CollectiveCall CollectiveCall::all_to_all_v(const void* send, std::span<const int64_t> send_counts, void* recv,
                                            std::span<const int64_t> recv_counts, DType dtype) {
  CollectiveCall c = call_of(CollectiveKind::AllToAllV, dtype);
  c.send = send;
  c.recv = recv;
  c.counts.assign(send_counts.begin(), send_counts.end());
  c.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  return c;
}

CollectiveCall CollectiveCall::barrier() { return call_of(CollectiveKind::Barrier, DType::F32); }

CollectiveCall CollectiveCall::split(int color, int key, const std::string& name) {
  CollectiveCall c = call_of(CollectiveKind::Split, DType::F32);
  c.color = color;
  c.key = key;
  c.name = name;
  return c;
}

std::string argument_problem(const CollectiveCall& call, int rank, int size) {
  Checks c;
  const int64_t n = call.count;
  switch (call.kind) {
    case CollectiveKind::AllReduce:
      c.count(n, "count");
      c.buffer(call.recv, n, "data");
      c.reduction(call.dtype, call.reduce_op);
      break;
    case CollectiveKind::ReduceScatter:
      c.count(n, "recv_count");
      c.buffer(call.send, n * size, "send");
      c.buffer(call.recv, n, "recv");
      c.reduction(call.dtype, call.reduce_op);
      break;
    case CollectiveKind::AllGather:
      c.count(n, "send_count");
      c.buffer(call.send, n, "send");
      c.buffer(call.recv, n * size, "recv");
      break;
    case CollectiveKind::AllGatherV:
      if (c.counts(call.counts, size, "counts")) {
        c.buffer(call.send, call.counts[static_cast<size_t>(rank)], "send");
        c.buffer(call.recv, sum(call.counts), "recv");
      }
      break;
    case CollectiveKind::Broadcast:
      c.count(n, "count");
      c.buffer(call.recv, n, "data");
      c.root(call.root, size);
      break;
    case CollectiveKind::Reduce:
      c.count(n, "count");
      c.buffer(call.send, n, "send");
      if (call.root == rank) c.buffer(call.recv, n, "recv (on the root)");
      c.reduction(call.dtype, call.reduce_op);
      c.root(call.root, size);
      break;
    case CollectiveKind::AllToAll:
      c.count(n, "count");
      c.buffer(call.send, n * size, "send");
      c.buffer(call.recv, n * size, "recv");
      break;
    case CollectiveKind::AllToAllV:
      c.counts(call.counts, size, "send_counts");
      c.counts(call.recv_counts, size, "recv_counts");
      c.buffer(call.send, sum(call.counts), "send");
      c.buffer(call.recv, sum(call.recv_counts), "recv");
      break;
    case CollectiveKind::Barrier:
      break;
    case CollectiveKind::Split:
      c.require(call.color < 0 || !call.name.empty(), [] { return "the new group needs a name (e.g. \"tp-0\")"; });
      break;
  }
  return c.take();
}

std::string overlap_problem(const CollectiveCall& call, int size) {
  int64_t sent = call.count * size;
  int64_t received = call.count * size;
  if (call.kind == CollectiveKind::AllToAllV) {
    sent = sum(call.counts);
    received = sum(call.recv_counts);
  }
  const auto element = static_cast<int64_t>(dtype_size(call.dtype));
  const int64_t send_bytes = sent * element;
  const int64_t recv_bytes = received * element;
  const auto* s = static_cast<const std::byte*>(call.send);
  const auto* r = static_cast<const std::byte*>(call.recv);
  const bool overlap = send_bytes > 0 && recv_bytes > 0 && s < r + recv_bytes && r < s + send_bytes;
  if (!overlap) return "";
  return "send and recv overlap; this collective has no in-place form, use separate buffers";
}

std::string message_problem(const void* data, int64_t count, int peer, int tag, int rank, int size,
                            const MessageLimits& limits) {
  Checks c;
  c.require(peer >= 0 && peer < size, [&] {
    return "peer " + std::to_string(peer) + " is not a rank of the group (0.." + std::to_string(size - 1) + ")";
  });
  c.require(limits.to_self || peer != rank, [&] { return "peer " + std::to_string(peer) + " is this rank itself"; });
  c.require(tag >= 0 && tag <= limits.max_tag, [&] {
    return "tag " + std::to_string(tag) + " is outside 0.." + limits.max_tag_name + " (" +
           std::to_string(limits.max_tag) + ")";
  });
  c.count(count, "count");
  c.buffer(data, count, "data");
  return c.take();
}

}  // namespace loom::comm
