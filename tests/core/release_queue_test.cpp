// Memory given back behind a fence (core/release_queue.h, what releasable device memory frees its
// granules through): nothing is freed before its fence passes, everything is freed exactly once
// after, in any order the fences pass; beyond a lane's limit that lane's oldest is waited for
// first; a granule taken back is never freed by its old release, and the caller sees that
// release's fence first; draining an owner frees its granules only.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "loom/core/release_queue.h"

namespace loom {
namespace {

// A fence the test passes by hand; wait() passes it and counts the waits.
struct FakeFence {
  std::shared_ptr<bool> is_passed = std::make_shared<bool>(false);
  std::shared_ptr<int> waits = std::make_shared<int>(0);
  int id = 0;
  bool passed() const { return *is_passed; }
  void wait() const {
    ++*waits;
    *is_passed = true;
  }
};

using Queue = ReleaseQueue<FakeFence>;
using Granule = Queue::Granule;

// What the queue freed, in order.
struct Freed {
  std::vector<Granule> granules;
  auto release() {
    return [this](const Granule& g) { granules.push_back(g); };
  }
};

FakeFence fence(int id) {
  FakeFence f;
  f.id = id;
  return f;
}

TEST(ReleaseQueue, FreesNothingBeforeItsFencePassesAndEachGranuleOnceAfterInTheOrderFencesPass) {
  Queue queue(8);
  Freed freed;
  const FakeFence first = fence(1), second = fence(2);
  queue.defer(0, first, {{100, 0}, {100, 1}}, freed.release());
  queue.defer(0, second, {{100, 5}}, freed.release());
  queue.collect(freed.release());
  EXPECT_TRUE(freed.granules.empty());
  EXPECT_TRUE(queue.pending({100, 1}));
  EXPECT_FALSE(queue.pending({100, 2}));
  EXPECT_FALSE(queue.pending({200, 1}));
  EXPECT_EQ(queue.pending_granules(), 3u);

  *second.is_passed = true;  // a later fence passing first (another stream)
  queue.collect(freed.release());
  ASSERT_EQ(freed.granules.size(), 1u);
  EXPECT_EQ(freed.granules[0], (Granule{100, 5}));
  *first.is_passed = true;
  queue.collect(freed.release());
  queue.collect(freed.release());
  const std::vector<Granule> want{{100, 5}, {100, 0}, {100, 1}};
  EXPECT_EQ(freed.granules, want);
  EXPECT_EQ(queue.pending_releases(), 0u);
  EXPECT_EQ(*first.waits + *second.waits, 0);  // nobody waited
}

TEST(ReleaseQueue, OneReleaseBeyondTheLimitWaitsForTheOldestFirst) {
  Queue queue(2);
  Freed freed;
  const FakeFence a = fence(1), b = fence(2), c = fence(3);
  queue.defer(0, a, {{1, 0}}, freed.release());
  queue.defer(0, b, {{1, 1}}, freed.release());
  EXPECT_EQ(*a.waits, 0);
  queue.defer(0, c, {{1, 2}}, freed.release());
  EXPECT_EQ(*a.waits, 1);
  EXPECT_EQ(*b.waits, 0);
  ASSERT_EQ(freed.granules.size(), 1u);
  EXPECT_EQ(freed.granules[0], (Granule{1, 0}));
  EXPECT_EQ(queue.pending_releases(), 2u);
  // One that passed by itself is freed without a wait when the next comes.
  *b.is_passed = true;
  queue.defer(0, fence(4), {{1, 3}}, freed.release());
  EXPECT_EQ(*b.waits, 0);
  EXPECT_EQ(*c.waits, 0);
  EXPECT_EQ(freed.granules.size(), 2u);
  // A release of no granules holds nothing.
  queue.defer(0, fence(5), {}, freed.release());
  EXPECT_EQ(queue.pending_releases(), 2u);
}

// The limit is each lane's (a stream of its own, another rank thread's): a lane at its limit waits
// for its own oldest release, never another lane's.
TEST(ReleaseQueue, EachLaneWaitsForItsOwnOldestRelease) {
  Queue queue(1);
  Freed freed;
  const FakeFence a = fence(1), b = fence(2), c = fence(3);
  queue.defer(10, a, {{1, 0}}, freed.release());
  queue.defer(20, b, {{2, 0}}, freed.release());
  EXPECT_EQ(*a.waits + *b.waits, 0);
  queue.defer(20, c, {{2, 1}}, freed.release());
  EXPECT_EQ(*a.waits, 0);
  EXPECT_EQ(*b.waits, 1);
  EXPECT_EQ(freed.granules, std::vector<Granule>{(Granule{2, 0})});
  EXPECT_EQ(queue.pending_releases(), 2u);
}

TEST(ReleaseQueue, AGranuleTakenBackIsNotFreedByItsOldReleaseAndItsFenceIsFollowed) {
  Queue queue(4);
  Freed freed;
  const FakeFence a = fence(7);
  queue.defer(0, a, {{1, 0}, {1, 1}}, freed.release());
  std::vector<int> followed;
  EXPECT_TRUE(queue.take_back({1, 1}, [&](const FakeFence& f) { followed.push_back(f.id); }));
  EXPECT_EQ(followed, std::vector<int>{7});
  EXPECT_FALSE(queue.pending({1, 1}));
  EXPECT_FALSE(queue.take_back({1, 1}, [&](const FakeFence& f) { followed.push_back(f.id); }));
  EXPECT_FALSE(queue.take_back({2, 0}, [&](const FakeFence& f) { followed.push_back(f.id); }));
  EXPECT_EQ(followed.size(), 1u);
  *a.is_passed = true;
  queue.collect(freed.release());
  EXPECT_EQ(freed.granules, std::vector<Granule>{(Granule{1, 0})});
  // Taking back a release's last granule drops the release: nothing left to wait for.
  queue.defer(0, fence(8), {{1, 4}}, freed.release());
  EXPECT_TRUE(queue.take_back({1, 4}, [](const FakeFence&) {}));
  EXPECT_EQ(queue.pending_releases(), 0u);
  // Granules given in any order: one taken back from the middle, the rest freed in index order.
  freed.granules.clear();
  const FakeFence b = fence(9);
  queue.defer(0, b, {{1, 9}, {1, 3}, {1, 7}}, freed.release());
  EXPECT_TRUE(queue.take_back({1, 7}, [](const FakeFence&) {}));
  EXPECT_EQ(queue.pending_granules(), 2u);
  EXPECT_TRUE(queue.pending({1, 9}));
  EXPECT_FALSE(queue.pending({1, 7}));
  *b.is_passed = true;
  queue.collect(freed.release());
  const std::vector<Granule> want{{1, 3}, {1, 9}};
  EXPECT_EQ(freed.granules, want);
}

TEST(ReleaseQueue, DrainingAnOwnerWaitsForAndFreesItsReleasesOnly) {
  Queue queue(8);
  Freed freed;
  const FakeFence mine = fence(1), theirs = fence(2);
  queue.defer(0, theirs, {{2, 0}}, freed.release());
  queue.defer(0, mine, {{1, 3}, {1, 4}}, freed.release());
  queue.drain(freed.release(), 1);
  EXPECT_EQ(*mine.waits, 1);
  EXPECT_EQ(*theirs.waits, 0);
  const std::vector<Granule> want{{1, 3}, {1, 4}};
  EXPECT_EQ(freed.granules, want);
  EXPECT_TRUE(queue.pending({2, 0}));
  queue.drain(freed.release());  // every owner
  EXPECT_EQ(*theirs.waits, 1);
  EXPECT_EQ(freed.granules.size(), 3u);
  EXPECT_EQ(queue.pending_releases(), 0u);
}

// A release that throws (the driver refusing an unmap) still has the entry's other granules
// released, then the first exception rethrown, and leaves no entry to be freed twice.
TEST(ReleaseQueue, AReleaseThatThrowsStillReleasesTheRestAndLeavesItsEntryOut) {
  Queue queue(8);
  Freed freed;
  const FakeFence a = fence(1);
  queue.defer(0, a, {{1, 0}, {1, 1}, {1, 2}}, freed.release());
  *a.is_passed = true;
  EXPECT_THROW(queue.collect([&](const Granule& g) {
    if (g.index != 2) throw static_cast<int>(g.index);
    freed.granules.push_back(g);
  }),
               int);
  EXPECT_EQ(freed.granules, std::vector<Granule>{(Granule{1, 2})});
  EXPECT_EQ(queue.pending_releases(), 0u);
  try {
    queue.defer(0, fence(2), {{1, 5}, {1, 6}}, freed.release());
    queue.drain([](const Granule& g) { throw static_cast<int>(g.index); });
    ADD_FAILURE() << "the release's exception was not rethrown";
  } catch (int first) {
    EXPECT_EQ(first, 5);
  }
  EXPECT_EQ(queue.pending_releases(), 0u);
}

}  // namespace
}  // namespace loom
