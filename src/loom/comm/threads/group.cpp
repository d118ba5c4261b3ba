#include "loom/comm/threads/group.h"

#include <sstream>

#include "loom/comm/activity.h"
#include "loom/core/error.h"

namespace loom::comm::threads {

namespace {

std::string list(const std::vector<int>& values) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
  return out.str();
}

}  // namespace

World::World(int size, CommOptions options, std::shared_ptr<LinkModel> link_model)
    : size_(size), options_(options), link_model_(std::move(link_model)) {}

void World::fail(int rank, std::exception_ptr error) {
  std::vector<std::shared_ptr<Group>> live;
  {
    std::lock_guard lock(mutex_);
    if (aborted_.load(std::memory_order_relaxed)) return;  // later failures are consequences
    first_error_ = error;
    abort_reason_ = "world rank " + std::to_string(rank) + " failed: " + describe_exception(error);
    aborted_.store(true, std::memory_order_release);
    for (const auto& weak : groups_) {
      if (auto group = weak.lock()) live.push_back(std::move(group));
    }
  }
  // Outside the world lock: waking takes each group's lock, and groups take the world lock
  // (add_group) while holding theirs.
  for (const auto& group : live) group->wake_all();
}

std::string World::abort_reason() const {
  std::lock_guard lock(mutex_);
  return abort_reason_;
}

std::exception_ptr World::first_error() const {
  std::lock_guard lock(mutex_);
  return first_error_;
}

void World::add_group(const std::shared_ptr<Group>& group) {
  std::lock_guard lock(mutex_);
  std::erase_if(groups_, [](const std::weak_ptr<Group>& g) { return g.expired(); });
  groups_.push_back(group);
}

std::shared_ptr<Group> Group::create(std::shared_ptr<World> world, std::string name, std::vector<int> world_ranks) {
  auto group = std::make_shared<Group>(world, std::move(name), std::move(world_ranks));
  world->add_group(group);
  return group;
}

Group::Group(std::shared_ptr<World> world, std::string name, std::vector<int> world_ranks)
    : world_(std::move(world)),
      name_(std::move(name)),
      world_ranks_(std::move(world_ranks)),
      last_started_(world_ranks_.size(), {-1, ""}),
      departed_(new std::atomic<bool>[world_ranks_.size()]) {
  for (size_t i = 0; i < world_ranks_.size(); ++i) departed_[i].store(false);
  p2p_.copies.resize(world_ranks_.size());
}

std::string Group::where(int rank, uint64_t seq, const std::string& kind) const {
  return "comm: group '" + name_ + "' (threads) " + kind + " #" + std::to_string(seq) + " on group rank " +
         std::to_string(rank) + " (world rank " + std::to_string(world_ranks_[rank]) + "): ";
}

std::string Group::describe_ranks(const std::vector<int>& group_ranks) const {
  std::vector<int> world;
  for (int r : group_ranks) world.push_back(world_ranks_[r]);
  if (group_ranks.size() == 1) {
    return "group rank " + std::to_string(group_ranks[0]) + " (world rank " + std::to_string(world[0]) + ")";
  }
  return "group ranks " + list(group_ranks) + " (world ranks " + list(world) + ")";
}

void Group::fail_locked(int rank, uint64_t seq, const std::string& kind, const std::string& why) {
  if (failure_.empty()) failure_ = why;
  cv_.notify_all();
  throw Error(where(rank, seq, kind) + why);
}

std::string Group::missing_ranks_locked(const Slot& slot) const {
  std::vector<int> missing, arrived;
  for (int q = 0; q < size(); ++q) (slot.arrived[q] ? arrived : missing).push_back(q);
  std::string text = describe_ranks(missing) + " never arrived (arrived: " + list(arrived) + ")";
  for (int q : missing) {
    const auto& [seq, kind] = last_started_[q];
    text += "; group rank " + std::to_string(q) +
            (seq < 0 ? " has started no collective on this group"
                     : " last started " + kind + " #" + std::to_string(seq));
  }
  return text;
}

Slot& Group::arrive(int rank, uint64_t seq, Post post, const Finalize& finalize) {
  const std::string kind = post.kind;
  std::unique_lock lock(mutex_);
  if (world_->aborted()) fail_locked(rank, seq, kind, "aborted because " + world_->abort_reason());
  if (!failure_.empty()) throw Error(where(rank, seq, kind) + "the group failed earlier: " + failure_);

  Slot& slot = slots_.try_emplace(seq, size()).first->second;
  slot.posts[rank] = std::move(post);
  slot.arrived[rank] = 1;
  ++slot.arrived_count;
  last_started_[rank] = {static_cast<int64_t>(seq), kind};
  if (slot.arrived_count == size()) {
    slot.error = finalize(slot);
    slot.complete = true;
    cv_.notify_all();
  } else {
    activity::Scope waiting(world_ranks_[rank], kind, name_, static_cast<int64_t>(seq));  // for heartbeats
    const auto timeout = world_->timeout();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    // A satisfied wait proceeds even if the world aborted meanwhile: the others already read
    // this rank's buffers. An unsatisfied one gives up and marks the group failed (under the
    // lock), so the slot can never complete without this rank.
    while (!slot.complete) {
      if (world_->aborted()) fail_locked(rank, seq, kind, "aborted because " + world_->abort_reason());
      if (!failure_.empty()) throw Error(where(rank, seq, kind) + "the group failed: " + failure_);
      for (int q = 0; q < size(); ++q) {
        if (!slot.arrived[q] && departed(q)) {
          fail_locked(rank, seq, kind,
                      describe_ranks({q}) + " left the group (its Communicator was destroyed, e.g. its body returned) "
                      "without issuing " + kind + " #" + std::to_string(seq) + "; " + missing_ranks_locked(slot));
        }
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !slot.complete) {
        fail_locked(rank, seq, kind,
                    "timed out after " + std::to_string(timeout.count()) + " ms in " + kind + " #" +
                        std::to_string(seq) + ": " + missing_ranks_locked(slot) +
                        ". Every rank of the group must issue the same collectives in the same order; if a rank "
                        "is only slow, raise runtime.timeout_s");
      }
    }
  }
  if (!slot.error.empty()) {
    if (failure_.empty()) failure_ = slot.error;
    throw Error(where(rank, seq, kind) + slot.error);
  }
  return slot;
}

void Group::barrier(Slot& slot) {
  std::unique_lock lock(mutex_);
  if (!slot.broken.empty()) throw SlotBroken(slot.broken);
  const uint64_t generation = slot.generation;
  if (++slot.at_barrier == size()) {
    slot.at_barrier = 0;
    ++slot.generation;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return slot.generation != generation || !slot.broken.empty(); });
  if (slot.generation == generation) throw SlotBroken(slot.broken);
}

void Group::leave(uint64_t seq, Slot& slot, const std::string& failure) {
  std::unique_lock lock(mutex_);
  ++slot.finished;
  if (!failure.empty()) {
    if (slot.broken.empty()) slot.broken = failure;
    if (failure_.empty()) failure_ = failure;
    cv_.notify_all();
    cv_.wait(lock, [&] { return slot.finished == size(); });
  } else if (slot.finished == size()) {
    cv_.notify_all();  // a failed rank may be waiting for the last reader
  }
  if (++slot.left == size()) slots_.erase(seq);
}

void Group::link(int source, int destination, int64_t bytes) const {
  LinkModel* model = world_->link_model();
  if (model == nullptr || source == destination || bytes <= 0) return;
  model->transfer(world_ranks_[source], world_ranks_[destination], bytes);
}

void Group::depart(int rank) {
  departed_[rank].store(true, std::memory_order_release);
  wake_all();
}

void Group::wake_all() {
  {
    std::lock_guard lock(mutex_);
    cv_.notify_all();
  }
  std::lock_guard lock(p2p_.mutex);
  p2p_.cv.notify_all();
}

}  // namespace loom::comm::threads
