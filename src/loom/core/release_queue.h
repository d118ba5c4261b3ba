#pragma once
// Memory given back behind a fence, so that giving it back never waits for the device: granules
// released while work that may still read or write them is in flight (on a GPU, kernels queued
// on the stream that released them) keep their memory until that work's fence has passed (an
// event recorded on the stream), and are freed by whichever later call of the owner finds it
// passed. Each lane (a GPU's stream) has at most `most_pending` releases waiting; one more first
// waits for that lane's oldest, which bounds the memory a lane holds past its release and how far
// its host thread runs ahead of the device (as FSDP's limit on all-gathers in flight does). A
// granule taken back before its fence passed (committed again) leaves its release and keeps its
// memory; the caller orders its next use after the fence. Not thread-safe: the owner locks
// around it.
//   Fence: movable; bool passed() (the work before it is done); void wait() (blocks until then).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <utility>
#include <vector>

namespace loom {

template <typename Fence>
class ReleaseQueue {
 public:
  struct Granule {
    uintptr_t owner = 0;  // the allocation (its base address)
    size_t index = 0;     // the granule's index in it
    bool operator==(const Granule&) const = default;
  };

  explicit ReleaseQueue(size_t most_pending) : most_pending_(std::max<size_t>(most_pending, 1)) {}

  // `granules` are released once `fence` (of `lane`) has passed: release(granule) then frees
  // each, in the order given. First frees what has passed, and waits for the lane's oldest
  // releases beyond the limit.
  template <typename Release>
  void defer(uintptr_t lane, Fence fence, std::vector<Granule> granules, Release&& release) {
    if (granules.empty()) return;
    collect(release);
    auto of_lane = [&](const Entry& e) { return e.lane == lane; };
    while (static_cast<size_t>(std::count_if(pending_.begin(), pending_.end(), of_lane)) >= most_pending_) {
      const auto oldest = std::find_if(pending_.begin(), pending_.end(), of_lane);
      oldest->fence.wait();
      finish(oldest, release);
    }
    pending_.push_back({lane, std::move(fence), std::move(granules)});
  }

  // Frees every release whose fence has passed (fences of different streams pass in any order).
  template <typename Release>
  void collect(Release&& release) {
    for (auto it = pending_.begin(); it != pending_.end();) it = it->fence.passed() ? finish(it, release) : ++it;
  }

  // Waits for and frees the releases holding granules of `owner` (every release when owner is 0):
  // before the owner's allocation goes, or when memory runs short.
  template <typename Release>
  void drain(Release&& release, uintptr_t owner = 0) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      const bool mine = owner == 0 || std::any_of(it->granules.begin(), it->granules.end(),
                                                  [&](const Granule& g) { return g.owner == owner; });
      if (!mine) {
        ++it;
        continue;
      }
      it->fence.wait();
      it = finish(it, release);
    }
  }

  // Whether `granule` waits to be released.
  bool pending(const Granule& granule) const {
    return std::any_of(pending_.begin(), pending_.end(), [&](const Entry& e) { return e.holds(granule); });
  }

  // Takes `granule` out of its pending release, if it is in one: follow(fence) runs first, so that
  // the caller orders its next use of the granule after the work the fence stands for. Returns
  // whether it was pending (then it still has its memory and contents).
  template <typename Follow>
  bool take_back(const Granule& granule, Follow&& follow) {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      auto g = std::find(it->granules.begin(), it->granules.end(), granule);
      if (g == it->granules.end()) continue;
      follow(it->fence);
      it->granules.erase(g);
      if (it->granules.empty()) pending_.erase(it);
      return true;
    }
    return false;
  }

  size_t pending_releases() const { return pending_.size(); }
  size_t pending_granules() const {
    size_t n = 0;
    for (const Entry& e : pending_) n += e.granules.size();
    return n;
  }

 private:
  struct Entry {
    uintptr_t lane = 0;
    Fence fence;
    std::vector<Granule> granules;
    bool holds(const Granule& g) const { return std::find(granules.begin(), granules.end(), g) != granules.end(); }
  };
  using Iterator = typename std::deque<Entry>::iterator;

  // Frees an entry whose fence has passed: taken out of the queue first, then every granule
  // released even where one throws (the first exception is rethrown after), so that none is left
  // neither pending nor freed.
  template <typename Release>
  Iterator finish(Iterator it, Release& release) {
    Entry entry = std::move(*it);
    Iterator next = pending_.erase(it);
    std::exception_ptr failed;
    for (const Granule& g : entry.granules) {
      try {
        release(g);
      } catch (...) {
        if (!failed) failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    return next;
  }

  size_t most_pending_;
  std::deque<Entry> pending_;
};

}  // namespace loom
