#pragma once
// Internal to the threads backend: the state that the ranks of one launch() (World) and of one
// process group (Group) share, and the rendezvous every collective goes through.
//
// A collective is operation number `seq` on its group. Every rank posts what it brings (a Post:
// what it asks for, as a signature string, and the buffers other ranks may read or write) into
// the Slot of that seq and waits until all have posted (arrive). From then on the ranks read
// each other's buffers directly; barriers inside the slot order the phases, and an operation
// that let other ranks touch its own buffers ends with one more barrier so no rank returns to
// its caller while another still reads its memory. Small inputs are copied into the slot
// instead (staged), so their operations need no closing barrier.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/comm/link_model.h"
#include "loom/core/error.h"

namespace loom::comm::threads {

class Group;

// Thrown by Group::barrier when another rank failed inside the same operation.
class SlotBroken : public Error {
 public:
  using Error::Error;
};

// Shared by every rank and group of one launch(): options, the simulated links, the abort flag.
class World {
 public:
  World(int size, CommOptions options, std::shared_ptr<LinkModel> link_model);

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  LinkModel* link_model() const { return link_model_.get(); }

  // World rank `rank` failed with `error`. The first failure aborts the world: every wait of
  // every group that is not already satisfied throws an Error naming this rank.
  void fail(int rank, std::exception_ptr error);
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() const;
  std::exception_ptr first_error() const;

  void add_group(const std::shared_ptr<Group>& group);

 private:
  const int size_;
  const CommOptions options_;
  const std::shared_ptr<LinkModel> link_model_;
  mutable std::mutex mutex_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  std::exception_ptr first_error_;
  std::vector<std::weak_ptr<Group>> groups_;  // to wake their waits on abort
};

// What one rank brings to a collective.
struct Post {
  std::string kind;       // "all_reduce", ... (for messages)
  std::string signature;  // kind and every argument all ranks must agree on
  const void* src = nullptr;  // what other ranks read from this rank: its buffer, or `staged`
  void* dst = nullptr;        // where other ranks may write (the root's result of a reduce)
  bool direct = false;        // other ranks touch this rank's own buffers (not a staged copy)
  std::unique_ptr<std::byte[]> staged;
  std::vector<int64_t> send_counts, recv_counts;  // all_to_all_v
  int color = -1, key = 0;                         // split
  std::string name;
};

// A rank's place in a group made by split (group null: the rank joined none).
struct SplitResult {
  std::shared_ptr<Group> group;
  int rank = -1;
};

// The meeting place of collective number `seq` on a group; it lives until every rank left.
struct Slot {
  explicit Slot(int size) : posts(size), arrived(size, 0), split(size) {}
  std::vector<Post> posts;
  std::vector<char> arrived;
  int arrived_count = 0;
  bool complete = false;  // every rank arrived and `finalize` ran
  std::string error;      // the posts disagree: every rank fails with this
  int at_barrier = 0;
  uint64_t generation = 0;  // barriers completed
  std::string broken;       // a rank failed after arrival; the others stop at their next barrier
  int finished = 0;         // ranks that no longer touch other ranks' buffers
  int left = 0;
  std::vector<SplitResult> split;
};

// Point-to-point messages of one group, matched on (source, destination, tag) in issue order.
struct P2PRequest {
  enum class State { Posted, Matched, Done, Failed };
  bool is_send = false;
  int source = 0, destination = 0, tag = 0;  // group ranks
  int64_t count = 0;
  DType dtype = DType::F32;
  const void* send_buffer = nullptr;
  void* recv_buffer = nullptr;
  uint64_t index = 0;  // how many earlier messages this side posted with the same (source, destination, tag)
  State state = State::Posted;
  std::string error;
  std::shared_ptr<P2PRequest> partner;  // the matched send, held by the recv until the copy ends
};

struct P2PState {
  using Key = std::tuple<int, int, int>;  // source, destination, tag
  std::mutex mutex;
  std::condition_variable cv;
  std::map<Key, std::deque<std::shared_ptr<P2PRequest>>> sends, recvs;  // not yet matched
  std::vector<std::deque<std::shared_ptr<P2PRequest>>> copies;         // matched recvs, per receiver
};

// Validates the posts of a slot once everyone arrived (and prepares shared results); runs under
// the group's lock by the last rank to arrive. Returns "" or what is wrong.
using Finalize = std::function<std::string(Slot& slot)>;

class Group {
 public:
  static std::shared_ptr<Group> create(std::shared_ptr<World> world, std::string name, std::vector<int> world_ranks);
  Group(std::shared_ptr<World> world, std::string name, std::vector<int> world_ranks);

  const std::string& name() const { return name_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  World& world() const { return *world_; }
  const std::shared_ptr<World>& world_ptr() const { return world_; }

  // "comm: group 'tp-0' (threads) all_reduce #3 on group rank 1 (world rank 5): "
  std::string where(int rank, uint64_t seq, const std::string& kind) const;
  // "group ranks [2] (world ranks [6])"
  std::string describe_ranks(const std::vector<int>& group_ranks) const;

  // Posts `rank`'s part of collective `seq` and waits for every rank's, up to the timeout.
  // Throws (and marks the group failed, so the operation can never start with this rank's
  // buffers gone) on timeout, abort, a rank that left the group, or posts that disagree.
  Slot& arrive(int rank, uint64_t seq, Post post, const Finalize& finalize);
  // Waits until every rank reaches this barrier of the slot. After arrival every rank runs the
  // same memory copies, which always end, so there is no timeout here: giving up would let this
  // rank free buffers the others still read. Throws if the slot is broken.
  void barrier(Slot& slot);
  // `rank` is done with the slot. `failure` non-empty: this rank failed after arrival; the slot
  // breaks and this rank waits until every rank stopped touching its buffers.
  void leave(uint64_t seq, Slot& slot, const std::string& failure);

  // Reports a transfer of `bytes` between group ranks to the link model (none between a rank
  // and itself, none of zero bytes). Called by the thread doing the copy, before copying.
  void link(int source, int destination, int64_t bytes) const;

  // `rank`'s communicator is gone: waits for it fail at once instead of timing out.
  void depart(int rank);
  bool departed(int rank) const { return departed_[rank].load(std::memory_order_acquire); }
  // Wakes every wait of this group (abort, departure).
  void wake_all();

  P2PState& p2p() { return p2p_; }

 private:
  [[noreturn]] void fail_locked(int rank, uint64_t seq, const std::string& kind, const std::string& why);
  std::string missing_ranks_locked(const Slot& slot) const;

  const std::shared_ptr<World> world_;
  const std::string name_;
  const std::vector<int> world_ranks_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<uint64_t, Slot> slots_;
  std::string failure_;  // set once: every later operation fails with it
  std::vector<std::pair<int64_t, std::string>> last_started_;  // per rank: seq and kind (-1: none)
  std::unique_ptr<std::atomic<bool>[]> departed_;
  P2PState p2p_;
};

}  // namespace loom::comm::threads
