#include "loom/comm/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

// The chunked hierarchical all-reduce of one call (see hierarchical.h): chunk i is
// reduce-scattered inside the site into a free shard buffer, its shard all-reduced across sites
// asynchronously, and once more than max_inflight chunks cross, the oldest is all-gathered
// inside the site straight into the data.
class ChunkPipeline {
 public:
  ChunkPipeline(Communicator& in_site, Communicator& across_sites, const HierarchicalOptions& options, char* data,
                int64_t count, DType dtype, ReduceOp op)
      : in_site_(in_site),
        across_sites_(across_sites),
        max_inflight_(options.max_inflight),
        data_(data),
        count_(count),
        dtype_(dtype),
        op_(op),
        s_(in_site.size()),
        element_(static_cast<int64_t>(dtype_size(dtype))),
        position_(in_site.rank()),
        // Chunks hold a multiple of s elements so that only the last one needs padding.
        chunk_(std::max<int64_t>(s_, options.chunk_bytes / element_ / s_ * s_)),
        chunks_((count + chunk_ - 1) / chunk_),
        // A shard buffer is busy from its chunk's reduce-scatter until its all-gather has read
        // it: max_inflight chunks crossing sites plus the one being reduce-scattered. (A gather
        // still running when its slot comes round again finishes before the next in-site
        // reduce-scatter anyway: operations on one group complete in issue order.)
        slots_(std::min<int64_t>(chunks_, options.max_inflight + 1)),
        shard_(chunk_ / s_),
        shards_(static_cast<size_t>(slots_ * shard_ * element_)),
        gathers_(static_cast<size_t>(slots_)),
        gather_counts_(static_cast<size_t>(slots_), std::vector<int64_t>(static_cast<size_t>(s_))) {}

  void run() {
    try {
      for (int64_t i = 0; i < chunks_; ++i) issue(i);
      while (!crossing_.empty()) retire();
      for (const WorkHandle& gather : gathers_) {
        if (gather) gather->wait();
      }
    } catch (...) {
      // Operations still pending may read or write the shards: let each end (or fail) before
      // the buffers go away.
      for (const Crossing& c : crossing_) settle(c.work);
      for (const WorkHandle& gather : gathers_) settle(gather);
      throw;
    }
  }

 private:
  struct Crossing {
    int64_t index;
    WorkHandle work;
  };

  int64_t chunk_length(int64_t i) const { return std::min(chunk_, count_ - i * chunk_); }
  // Block j of a chunk of `length` elements reduce-scattered in blocks of ceil(length / s):
  // how many of its elements are data rather than padding.
  int64_t block_count(int64_t length, int64_t j) const {
    const int64_t block = (length + s_ - 1) / s_;
    return std::clamp<int64_t>(length - j * block, 0, block);
  }
  char* shard(int64_t slot) { return shards_.data() + slot * shard_ * element_; }

  // Chunk i: in-site reduce-scatter into a free shard buffer, then its cross-site all-reduce
  // in flight; the oldest crossing is gathered once more than max_inflight are.
  void issue(int64_t i) {
    const int64_t slot = i % slots_;
    if (gathers_[static_cast<size_t>(slot)]) gathers_[static_cast<size_t>(slot)]->wait();  // previous chunk read out
    const int64_t length = chunk_length(i);
    const int64_t block = (length + s_ - 1) / s_;
    const char* send = data_ + i * chunk_ * element_;
    if (length % s_ != 0) {
      // Zero padding: the padded elements are reduced and then dropped by the all-gather.
      padded_.assign(static_cast<size_t>(block * s_ * element_), 0);
      std::memcpy(padded_.data(), send, static_cast<size_t>(length * element_));
      send = padded_.data();
    }
    char* mine = shard(slot);
    in_site_.reduce_scatter(send, mine, block, dtype_, op_);
    // Only the real elements of this rank's block cross sites; the cross-site group shares the
    // position, hence the block and its count.
    crossing_.push_back({i, across_sites_.all_reduce_async(mine, block_count(length, position_), dtype_, op_)});
    // Retire by count, never by polling: every rank must issue the in-site all-gathers and
    // reduce-scatters in the same order.
    if (static_cast<int>(crossing_.size()) > max_inflight_) retire();
  }

  // Cross-site step done: gather the reduced shards straight into the data.
  void retire() {
    Crossing done = crossing_.front();
    crossing_.pop_front();
    done.work->wait();
    const int64_t slot = done.index % slots_;
    const int64_t length = chunk_length(done.index);
    std::vector<int64_t>& counts = gather_counts_[static_cast<size_t>(slot)];
    for (int64_t j = 0; j < s_; ++j) counts[static_cast<size_t>(j)] = block_count(length, j);
    gathers_[static_cast<size_t>(slot)] =
        in_site_.all_gather_v_async(shard(slot), data_ + done.index * chunk_ * element_, counts, dtype_);
  }

  static void settle(const WorkHandle& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {  // the first error is the one rethrown
    }
  }

  Communicator& in_site_;
  Communicator& across_sites_;
  const int max_inflight_;
  char* const data_;
  const int64_t count_;
  const DType dtype_;
  const ReduceOp op_;
  const int64_t s_;
  const int64_t element_;
  const int position_;  // this rank's block of every chunk
  const int64_t chunk_;
  const int64_t chunks_;
  const int64_t slots_;
  const int64_t shard_;
  std::vector<char> shards_;
  std::vector<WorkHandle> gathers_;
  std::vector<std::vector<int64_t>> gather_counts_;
  std::vector<char> padded_;  // the last chunk when its length is not a multiple of s
  std::deque<Crossing> crossing_;
};

}  // namespace

HierarchicalAllReduce::HierarchicalAllReduce(Communicator& group, const Topology& topology, HierarchicalOptions options)
    : group_(&group), options_(options) {
  LOOM_CHECK(options_.chunk_bytes >= 1 && options_.max_inflight >= 1,
        "hierarchical all-reduce: chunk_bytes = " + std::to_string(options_.chunk_bytes) +
            " and max_inflight = " + std::to_string(options_.max_inflight) + " must both be >= 1");
  const std::vector<int>& world_ranks = group.world_ranks();
  // The sites this group touches, numbered densely in site order, and each member's position
  // among the group's ranks of its site (members are visited in group-rank order).
  std::map<int, std::vector<int>> members_of_site;  // topology site -> group ranks
  for (int r = 0; r < group.size(); ++r) {
    LOOM_CHECK(world_ranks[r] < topology.world_size(),
          "hierarchical all-reduce: group '" + group.name() + "' has world rank " + std::to_string(world_ranks[r]) +
              " but the topology describes " + std::to_string(topology.world_size()) + " ranks");
    members_of_site[topology.site_of(world_ranks[r])].push_back(r);
  }
  sites_ = static_cast<int>(members_of_site.size());
  ranks_per_site_ = static_cast<int>(members_of_site.begin()->second.size());
  int my_site = 0, my_position = 0, index = 0;
  std::string counts;
  bool even = true;
  for (const auto& [site, members] : members_of_site) {
    even = even && static_cast<int>(members.size()) == ranks_per_site_;
    counts += (counts.empty() ? "" : ", ") + std::to_string(members.size()) + " in site " + std::to_string(site);
    auto it = std::find(members.begin(), members.end(), group.rank());
    if (it != members.end()) {
      my_site = index;
      my_position = static_cast<int>(it - members.begin());
    }
    ++index;
  }
  LOOM_CHECK(even, "hierarchical all-reduce: group '" + group.name() + "' has " + counts +
                  "; every site needs the same number of the group's ranks");
  in_site_ = group.split(my_site, group.rank(), group.name() + ".site-" + std::to_string(my_site));
  across_sites_ = group.split(my_position, my_site, group.name() + ".cross-" + std::to_string(my_position));
}

void HierarchicalAllReduce::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  LOOM_CHECK(count >= 0,
        "hierarchical all-reduce on '" + group_->name() + "': count " + std::to_string(count) + " must be >= 0");
  // Degenerate shapes are one plain all-reduce: nothing to save on the long-haul link.
  if (sites_ == 1) return in_site_->all_reduce(data, count, dtype, op);
  if (ranks_per_site_ == 1) return across_sites_->all_reduce(data, count, dtype, op);
  if (count == 0) return;  // every rank has the same count, so every rank returns here
  chunked(static_cast<char*>(data), count, dtype, op);
}

void HierarchicalAllReduce::chunked(char* data, int64_t count, DType dtype, ReduceOp op) {
  ChunkPipeline(*in_site_, *across_sites_, options_, data, count, dtype, op).run();
}

}  // namespace loom::comm
