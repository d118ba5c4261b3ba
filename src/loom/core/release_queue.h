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
    bool operator<(const Granule& o) const { return owner != o.owner ? owner < o.owner : index < o.index; }
  };

  explicit ReleaseQueue(size_t most_pending) : most_pending_(std::max<size_t>(most_pending, 1)) {}

  // `granules` are released once `fence` (of `lane`) has passed: release(granule) then frees
  // each, in (owner, index) order. First frees what has passed, and waits for the lane's oldest
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
    std::sort(granules.begin(), granules.end());  // looked up by binary search
    const size_t count = granules.size();
    pending_.push_back({lane, std::move(fence), std::move(granules), std::vector<char>(count, 0), count});
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
      // (A granule taken back still names its owner here: draining it too only waits earlier.)
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
    return std::any_of(pending_.begin(), pending_.end(), [&](const Entry& e) { return e.find(granule) >= 0; });
  }

  // Takes `granule` out of its pending release, if it is in one: follow(fence) runs first, so that
  // the caller orders its next use of the granule after the work the fence stands for. Returns
  // whether it was pending (then it still has its memory and contents).
  template <typename Follow>
  bool take_back(const Granule& granule, Follow&& follow) {
    for (auto it = pending_.begin(); it != pending_.end(); ++it) {
      const std::ptrdiff_t at = it->find(granule);
      if (at < 0) continue;
      follow(it->fence);
      it->taken[static_cast<size_t>(at)] = 1;  // marked, not erased: taking a whole release back stays linear
      if (--it->left == 0) pending_.erase(it);
      return true;
    }
    return false;
  }

  size_t pending_releases() const { return pending_.size(); }
  size_t pending_granules() const {
    size_t n = 0;
    for (const Entry& e : pending_) n += e.left;
    return n;
  }

 private:
  struct Entry {
    uintptr_t lane = 0;
    Fence fence;
    std::vector<Granule> granules;  // sorted
    std::vector<char> taken;        // per granule: taken back
    size_t left = 0;                // granules not taken back
    // The granule's position when it is still to be released, else -1.
    std::ptrdiff_t find(const Granule& g) const {
      const auto at = std::lower_bound(granules.begin(), granules.end(), g);
      if (at == granules.end() || !(*at == g)) return -1;
      const std::ptrdiff_t i = at - granules.begin();
      return taken[static_cast<size_t>(i)] ? -1 : i;
    }
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
    for (size_t i = 0; i < entry.granules.size(); ++i) {
      if (entry.taken[i]) continue;
      const Granule& g = entry.granules[i];
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
