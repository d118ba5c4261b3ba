#include "loom/comm/nccl/communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <thread>

#include "loom/comm/watchdog.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/stream_event.h"

namespace loom::comm {

namespace {

void check_nccl(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess && result != ncclInProgress)
    throw Error("NCCL: " + what + " failed: " + ncclGetErrorString(result) + " (" + ncclGetLastError(nullptr) + ")");
}
void check_runtime(cudaError_t result, const std::string& what) {
  if (result != cudaSuccess) throw Error("CUDA: " + what + " failed: " + cudaGetErrorName(result) + " (" +
                                         cudaGetErrorString(result) + ")");
}

// NCCL's element type for a reduction; data movement goes as bytes (every dtype).
ncclDataType_t reduce_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::F8E4M3: return ncclFloat8e4m3;
    case DType::F8E5M2: return ncclFloat8e5m2;
    default: throw Error("nccl backend: no reduction over " + dtype_name(dtype) + " elements");
  }
}
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// A reduction over one rank is the identity, so a group of one copies instead of calling NCCL:
// faster, and NCCL's one-rank ncclAvg left the last elements of a count 2^20 + 3 unwritten
// (seen on an H100 with PyTorch's NCCL for CUDA 13, out of place).
auto one_rank_copy(const void* send, void* recv, size_t bytes) {
  return [=](ncclComm_t, cudaStream_t stream) {
    if (send != recv && bytes > 0)
      check_runtime(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync (one rank)");
  };
}

// The state every group of one rank shares: its GPU and NCCL communicator. Once aborted (a
// timeout, an asynchronous NCCL error) the communicator is gone and every operation of the group,
// pending or new, fails.
struct Endpoint {
  std::atomic<ncclComm_t> comm{nullptr};
  std::atomic<bool> aborted{false};
  int device = 0;
  cudaStream_t stream = nullptr;  // the communication stream
  float* scratch = nullptr;       // barrier's one element
  // Once, from whichever thread gets there first (a waiting thread or the watchdog may time out
  // while another issues; ncclCommAbort is what unblocks a rank stuck in NCCL). The first reason
  // is kept for every later operation's error.
  void abort(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(reason_mutex);
      if (reason.empty()) reason = why;
    }
    aborted = true;
    std::unique_lock<std::shared_mutex> lock(comm_mutex);
    if (ncclComm_t c = comm.exchange(nullptr)) ncclCommAbort(c);
  }
  // Held (shared) by whoever asks the communicator for its asynchronous error, so that an abort
  // on another thread never frees it meanwhile.
  std::shared_mutex comm_mutex;
  std::string aborted_because() const {
    std::lock_guard<std::mutex> lock(reason_mutex);
    return "the NCCL communicator was aborted (" + reason + ")";
  }
  mutable std::mutex reason_mutex;
  std::string reason;
  // Destroying waits for the communicator's work: with work still queued (a rank unwinding after a
  // failure, its peers gone) that could be forever, so it is aborted instead. The last holder may
  // be any thread (the watchdog's too), with another device current.
  ~Endpoint() {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current != device) (void)cudaSetDevice(device);
    if (ncclComm_t c = comm.exchange(nullptr)) {
      if (stream == nullptr || cudaStreamQuery(stream) == cudaSuccess) {
        ncclCommDestroy(c);
      } else {
        ncclCommAbort(c);
      }
    }
    if (scratch) cudaFree(scratch);
    if (stream) cudaStreamDestroy(stream);
    if (current >= 0 && current != device) (void)cudaSetDevice(current);
  }
};

// ncclGroupStart ... ncclGroupEnd whose end is called however the calls between end: NCCL keeps a
// group open per thread, and every later NCCL call of the thread would join the open group and
// never run.
class NcclGroup {
 public:
  NcclGroup() { check_nccl(ncclGroupStart(), "ncclGroupStart"); }
  void end() {
    open_ = false;
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();  // unwinding: the error that got us here is the one reported
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = true;
};

// An operation's completion event, destroyed by its last holder (its handle, the watchdog).
using CompletionEvent = std::shared_ptr<const kernels::cuda::StreamEvent>;

// What polling an operation does when NCCL reports an asynchronous error: the thread that waits
// for it aborts the communicator (NCCL's guidance: it is unusable) and throws; the watchdog only
// reports, since the process ends at once and an abort can itself wait for the device.
enum class OnAsyncError { Abort, Report };

// Where an operation stands, seen from any thread: Done, Pending, or Failed with why (the
// communicator aborted, a CUDA error, or an asynchronous NCCL error).
Watchdog::Poll poll_operation(Endpoint& endpoint, cudaEvent_t done, OnAsyncError on_async_error) {
  using State = Watchdog::State;
  // An aborted communicator's kernels stop, so its events complete without the data.
  if (endpoint.aborted) return {State::Failed, endpoint.aborted_because()};
  const cudaError_t state = cudaEventQuery(done);
  if (state == cudaSuccess) return {State::Done, ""};
  if (state != cudaErrorNotReady)
    return {State::Failed, std::string("CUDA: ") + cudaGetErrorName(state) + " (" + cudaGetErrorString(state) + ")"};
  std::string why;
  {
    // Busy: another thread is aborting; the next poll sees it aborted.
    std::shared_lock<std::shared_mutex> lock(endpoint.comm_mutex, std::try_to_lock);
    if (!lock.owns_lock()) return {State::Pending, ""};
    const ncclComm_t comm = endpoint.comm;
    if (comm == nullptr) return {State::Failed, endpoint.aborted_because()};
    ncclResult_t async = ncclSuccess;
    const ncclResult_t asked = ncclCommGetAsyncError(comm, &async);
    const ncclResult_t error = asked != ncclSuccess ? asked : async;
    if (error == ncclSuccess || error == ncclInProgress) return {State::Pending, ""};
    why = std::string("NCCL: ") + ncclGetErrorString(error) + " (" + ncclGetLastError(comm) + ")";
  }
  if (on_async_error == OnAsyncError::Report) return {State::Failed, why};
  endpoint.abort(why);
  return {State::Failed, why + "; the NCCL communicator is aborted"};
}

// The watchdog of every operation whose result a compute stream waits for (wait_in_stream). A
// failure ends the process at once, status 1, after saying which operation and why: the compute
// stream may already have run on with the operation's incomplete data, so nothing this process
// would do next (an optimizer step, a checkpoint) can be trusted; the job's launcher or `loom
// launch`'s supervisor takes it from there.
Watchdog& stream_watchdog() {
  static Watchdog watchdog(
      [](const std::string& message) {
        std::fprintf(stderr, "loom: error: %s; the compute stream may have read its incomplete result, so the process "
                     "ends\n", message.c_str());
        std::fflush(nullptr);  // what the process printed before, then the reason
        std::_Exit(1);
      },
      std::chrono::milliseconds(2));
  return watchdog;
}

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Endpoint> endpoint, CompletionEvent done, std::string what,
           std::chrono::milliseconds timeout)
      : endpoint_(std::move(endpoint)), done_(std::move(done)), what_(std::move(what)), timeout_(timeout) {}
  bool test() override {
    const Watchdog::Poll p = poll_operation(*endpoint_, done_->event(), OnAsyncError::Abort);
    if (p.state == Watchdog::State::Failed) throw Error(what_ + ": " + p.why);
    return p.state == Watchdog::State::Done;
  }
  void wait() override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!test()) {
      if (std::chrono::steady_clock::now() > deadline) {
        const std::string message = what_ + " timed out after " + std::to_string(timeout_.count()) +
                                    " ms (some rank did not issue it; the NCCL communicator is aborted)";
        endpoint_->abort(message);
        throw Error(message);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  // The calling thread's compute stream waits for the completion event; the host goes on. The
  // watchdog keeps the timeout (once per operation, however often it is waited for).
  void wait_in_stream() override {
    if (endpoint_->aborted) throw Error(what_ + ": " + endpoint_->aborted_because());
    check_runtime(cudaSetDevice(endpoint_->device), "cudaSetDevice");
    check_runtime(cudaStreamWaitEvent(kernels::cuda::compute_stream(endpoint_->device), done_->event(), 0),
                  what_ + ": cudaStreamWaitEvent (compute stream)");
    if (watched_) return;
    watched_ = true;
    // The watch holds the group and the event until the operation ends: a communicator destroyed
    // meanwhile still ends its work (destroyed, not aborted) and its failures are still seen. No
    // abort past the timeout: the process ends, and an abort could wait for the device forever.
    stream_watchdog().watch(what_, timeout_, [endpoint = endpoint_, done = done_]() -> Watchdog::Poll {
      if (cudaSetDevice(endpoint->device) != cudaSuccess) return {Watchdog::State::Pending, ""};
      return poll_operation(*endpoint, done->event(), OnAsyncError::Report);
    });
  }

 private:
  std::shared_ptr<Endpoint> endpoint_;
  CompletionEvent done_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool watched_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Endpoint> endpoint, std::string name, std::vector<int> world_ranks,
                   CommOptions options)
      : endpoint_(std::move(endpoint)), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
        options_(options) {
    check_nccl(ncclCommUserRank(endpoint_->comm, &rank_), "ncclCommUserRank");
    check_nccl(ncclCommCount(endpoint_->comm, &size_), "ncclCommCount");
    if (world_ranks_.empty()) {
      world_ranks_.resize(static_cast<size_t>(size_));
      std::iota(world_ranks_.begin(), world_ranks_.end(), 0);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const std::vector<int>& world_ranks() const override { return world_ranks_; }
  std::string backend() const override { return "nccl"; }

  WorkHandle all_reduce_async(void* data, int64_t count, DType dtype, ReduceOp op) override {
    reduce_type(dtype);  // the same error as NCCL would give for an element type it cannot reduce
    if (size_ == 1) return issue("all_reduce", [](ncclComm_t, cudaStream_t) {});
    return issue("all_reduce", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclAllReduce(data, data, size_t(count), reduce_type(dtype), nccl_op(op), c, s), "ncclAllReduce");
    });
  }
  WorkHandle reduce_scatter_async(const void* send, void* recv, int64_t recv_count, DType dtype,
                                  ReduceOp op) override {
    reduce_type(dtype);
    if (size_ == 1) return issue("reduce_scatter", one_rank_copy(send, recv, bytes(recv_count, dtype)));
    return issue("reduce_scatter", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclReduceScatter(send, recv, size_t(recv_count), reduce_type(dtype), nccl_op(op), c, s),
                 "ncclReduceScatter");
    });
  }
  WorkHandle all_gather_async(const void* send, void* recv, int64_t send_count, DType dtype) override {
    return issue("all_gather", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclAllGather(send, recv, bytes(send_count, dtype), ncclUint8, c, s), "ncclAllGather");
    });
  }
  WorkHandle all_gather_v_async(const void* send, void* recv, std::span<const int64_t> counts,
                                DType dtype) override {
    check_counts(counts, "all_gather_v");
    return issue("all_gather_v", [&](ncclComm_t c, cudaStream_t s) {
      size_t offset = 0;
      NcclGroup group;
      for (int r = 0; r < size_; ++r) {
        const size_t n = bytes(counts[size_t(r)], dtype);
        if (n > 0)
          check_nccl(ncclBroadcast(send, static_cast<char*>(recv) + offset, n, ncclUint8, r, c, s), "ncclBroadcast");
        offset += n;
      }
      group.end();
    });
  }
  WorkHandle broadcast_async(void* data, int64_t count, DType dtype, int root) override {
    check_rank(root, "broadcast root");
    return issue("broadcast", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclBroadcast(data, data, bytes(count, dtype), ncclUint8, root, c, s), "ncclBroadcast");
    });
  }
  WorkHandle reduce_async(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op, int root) override {
    check_rank(root, "reduce root");
    reduce_type(dtype);
    if (size_ == 1) return issue("reduce", one_rank_copy(send, recv, bytes(count, dtype)));
    return issue("reduce", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclReduce(send, recv, size_t(count), reduce_type(dtype), nccl_op(op), root, c, s), "ncclReduce");
    });
  }
  WorkHandle all_to_all_async(const void* send, void* recv, int64_t count, DType dtype) override {
    const std::vector<int64_t> counts(static_cast<size_t>(size_), count);
    return all_to_all_v_async(send, counts, recv, counts, dtype);
  }
  WorkHandle all_to_all_v_async(const void* send, std::span<const int64_t> send_counts, void* recv,
                                std::span<const int64_t> recv_counts, DType dtype) override {
    check_counts(send_counts, "all_to_all_v send counts");
    check_counts(recv_counts, "all_to_all_v recv counts");
    return issue("all_to_all_v", [&](ncclComm_t c, cudaStream_t s) {
      size_t send_offset = 0, recv_offset = 0;
      NcclGroup group;
      for (int r = 0; r < size_; ++r) {
        const size_t out = bytes(send_counts[size_t(r)], dtype), in = bytes(recv_counts[size_t(r)], dtype);
        if (out > 0)
          check_nccl(ncclSend(static_cast<const char*>(send) + send_offset, out, ncclUint8, r, c, s), "ncclSend");
        if (in > 0) check_nccl(ncclRecv(static_cast<char*>(recv) + recv_offset, in, ncclUint8, r, c, s), "ncclRecv");
        send_offset += out;
        recv_offset += in;
      }
      group.end();
    });
  }
  WorkHandle barrier_async() override {
    return issue("barrier", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclAllReduce(endpoint_->scratch, endpoint_->scratch, 1, ncclFloat32, ncclSum, c, s), "ncclAllReduce");
    });
  }
  WorkHandle send_async(const void* data, int64_t count, DType dtype, int peer, int /*tag*/) override {
    check_rank(peer, "send peer");
    return issue("send", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclSend(data, bytes(count, dtype), ncclUint8, peer, c, s), "ncclSend");
    });
  }
  WorkHandle recv_async(void* data, int64_t count, DType dtype, int peer, int /*tag*/) override {
    check_rank(peer, "recv peer");
    return issue("recv", [&](ncclComm_t c, cudaStream_t s) {
      check_nccl(ncclRecv(data, bytes(count, dtype), ncclUint8, peer, c, s), "ncclRecv");
    });
  }
  // One NCCL group: every op of the batch runs in one launch, so sends and recvs between two
  // ranks progress together whatever their order. NCCL has no tags: the ops of one batch between
  // one pair of ranks match the peer's in issue order (send k to a peer with its recv k from us).
  // A rank may send to itself (NCCL >= 2.7) when the batch also holds the matching recv.
  std::vector<WorkHandle> exchange_async(std::span<const PeerOp> ops) override {
    for (const PeerOp& op : ops) check_rank(op.peer, op.is_send() ? "exchange send peer" : "exchange recv peer");
    WorkHandle group = issue("exchange", [&](ncclComm_t c, cudaStream_t s) {
      NcclGroup batch;
      for (const PeerOp& op : ops) {
        const size_t n = bytes(op.count, op.dtype);
        if (n == 0) continue;
        if (op.is_send()) {
          check_nccl(ncclSend(op.data, n, ncclUint8, op.peer, c, s), "ncclSend");
        } else {
          check_nccl(ncclRecv(op.data, n, ncclUint8, op.peer, c, s), "ncclRecv");
        }
      }
      batch.end();
    });
    return std::vector<WorkHandle>(ops.size(), group);  // one event: the group completes as a whole
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  static size_t bytes(int64_t count, DType dtype) {
    LOOM_CHECK(count >= 0, "nccl backend: a count of " + std::to_string(count) + " elements (counts are >= 0)");
    return static_cast<size_t>(count) * dtype_size(dtype);
  }
  void check_rank(int r, const char* what) const {
    LOOM_CHECK(r >= 0 && r < size_, "nccl group '" + name_ + "': " + what + " " + std::to_string(r) +
                                        " is outside [0, " + std::to_string(size_) + ")");
  }
  void check_counts(std::span<const int64_t> counts, const char* what) const {
    LOOM_CHECK(static_cast<int>(counts.size()) == size_, "nccl group '" + name_ + "': " + what + " has " +
                                                            std::to_string(counts.size()) + " entries for " +
                                                            std::to_string(size_) + " ranks");
  }

  // Runs `body` on the communication stream after the work the calling thread's compute stream
  // (kernels/cuda/compute_streams.h) has queued, and returns a handle on its completion event.
  template <typename Body>
  WorkHandle issue(const char* op, Body&& body) {
    const ncclComm_t comm = endpoint_->comm;
    LOOM_CHECK(comm != nullptr, "nccl group '" + name_ + "': " + op + " after " + endpoint_->aborted_because());
    check_runtime(cudaSetDevice(endpoint_->device), "cudaSetDevice");
    const kernels::cuda::StreamEvent ready(kernels::cuda::compute_stream(endpoint_->device));
    check_runtime(cudaStreamWaitEvent(endpoint_->stream, ready.event(), 0), "cudaStreamWaitEvent");
    body(comm, endpoint_->stream);
    auto done = std::make_shared<const kernels::cuda::StreamEvent>(endpoint_->stream);
    const std::string what = "nccl group '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
                             std::to_string(size_) + "): " + op + " #" + std::to_string(++sequence_);
    return std::make_shared<NcclWork>(endpoint_, done, what, options_.timeout);
  }

  std::shared_ptr<Endpoint> endpoint_;
  std::string name_;
  std::vector<int> world_ranks_;
  CommOptions options_;
  int rank_ = 0, size_ = 0;
  int64_t sequence_ = 0;
};

std::shared_ptr<Endpoint> make_endpoint(int device) {
  auto endpoint = std::make_shared<Endpoint>();
  endpoint->device = device;
  check_runtime(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  check_runtime(cudaStreamCreateWithFlags(&endpoint->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_runtime(cudaMalloc(reinterpret_cast<void**>(&endpoint->scratch), sizeof(float)), "cudaMalloc");
  return endpoint;
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  // Every member's (color, key, world rank), gathered first so the new group knows its members.
  int* made = nullptr;
  check_runtime(cudaSetDevice(endpoint_->device), "cudaSetDevice");
  check_runtime(cudaMalloc(reinterpret_cast<void**>(&made), sizeof(int) * 3 * (size_ + 1)), "cudaMalloc");
  const std::unique_ptr<int, decltype(&cudaFree)> table(made, &cudaFree);  // freed on every path
  const int mine[3] = {color, key, world_ranks_[size_t(rank_)]};
  check_runtime(cudaMemcpy(table.get(), mine, sizeof mine, cudaMemcpyHostToDevice), "cudaMemcpy");
  all_gather_async(table.get(), table.get() + 3, 3, DType::I32)->wait();
  std::vector<int> all(static_cast<size_t>(3 * size_));
  check_runtime(cudaMemcpy(all.data(), table.get() + 3, all.size() * sizeof(int), cudaMemcpyDeviceToHost),
                "cudaMemcpy");
  ncclComm_t child = nullptr;
  check_nccl(ncclCommSplit(endpoint_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr),
             "ncclCommSplit");
  if (color < 0) return nullptr;
  std::vector<int> members;  // old ranks of the new group, by (key, rank)
  for (int r = 0; r < size_; ++r)
    if (all[size_t(3 * r)] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[size_t(3 * a + 1)] < all[size_t(3 * b + 1)]; });
  std::vector<int> world;
  for (int r : members) world.push_back(all[size_t(3 * r + 2)]);
  auto endpoint = make_endpoint(endpoint_->device);
  endpoint->comm = child;
  return std::make_unique<NcclCommunicator>(std::move(endpoint), name, std::move(world), options_);
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_nccl_communicators(std::span<const int> devices,
                                                                   const std::string& name,
                                                                   const CommOptions& options) {
  LOOM_CHECK(!devices.empty(), "make_nccl_communicators: no devices given");
  std::vector<ncclComm_t> comms(devices.size());
  check_nccl(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < devices.size(); ++r) {
    auto endpoint = make_endpoint(devices[r]);
    endpoint->comm = comms[r];
    out.push_back(std::make_unique<NcclCommunicator>(std::move(endpoint), name, std::vector<int>{}, options));
  }
  return out;
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device, const std::string& name,
                                                     const CommOptions& options) {
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  static_assert(sizeof(id) % sizeof(int32_t) == 0);
  bootstrap.broadcast(&id, sizeof(id) / sizeof(int32_t), DType::I32, 0);
  auto endpoint = make_endpoint(device);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
  endpoint->comm = comm;
  return std::make_unique<NcclCommunicator>(std::move(endpoint), name, bootstrap.world_ranks(), options);
}

}  // namespace loom::comm
