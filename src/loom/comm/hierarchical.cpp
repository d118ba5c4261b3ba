#include "loom/comm/hierarchical.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "loom/core/error.h"

namespace loom::comm {

HierarchicalAllReduce::HierarchicalAllReduce(Communicator& group, const Topology& topology, HierarchicalOptions options)
    : group_(&group), options_(options) {
  check(options_.chunk_bytes >= 1 && options_.max_inflight >= 1,
        "hierarchical all-reduce: chunk_bytes = " + std::to_string(options_.chunk_bytes) +
            " and max_inflight = " + std::to_string(options_.max_inflight) + " must both be >= 1");
  const std::vector<int>& world_ranks = group.world_ranks();
  // The sites this group touches, numbered densely in site order, and each member's position
  // among the group's ranks of its site (members are visited in group-rank order).
  std::map<int, std::vector<int>> members_of_site;  // topology site -> group ranks
  for (int r = 0; r < group.size(); ++r) {
    check(world_ranks[r] < topology.world_size(),
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
  check(even, "hierarchical all-reduce: group '" + group.name() + "' has " + counts +
                  "; every site needs the same number of the group's ranks");
  in_site_ = group.split(my_site, group.rank(), group.name() + ".site-" + std::to_string(my_site));
  across_sites_ = group.split(my_position, my_site, group.name() + ".cross-" + std::to_string(my_position));
}

void HierarchicalAllReduce::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  check(count >= 0,
        "hierarchical all-reduce on '" + group_->name() + "': count " + std::to_string(count) + " must be >= 0");
  // Degenerate shapes are one plain all-reduce: nothing to save on the long-haul link.
  if (sites_ == 1) return in_site_->all_reduce(data, count, dtype, op);
  if (ranks_per_site_ == 1) return across_sites_->all_reduce(data, count, dtype, op);
  if (count == 0) return;  // every rank has the same count, so every rank returns here
  chunked(static_cast<char*>(data), count, dtype, op);
}

void HierarchicalAllReduce::chunked(char* data, int64_t count, DType dtype, ReduceOp op) {
  const int64_t s = ranks_per_site_;
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  const int position = in_site_->rank();  // this rank's block of every chunk
  // Chunks hold a multiple of s elements so that only the last one needs padding.
  const int64_t chunk = std::max<int64_t>(s, options_.chunk_bytes / element / s * s);
  const int64_t chunks = (count + chunk - 1) / chunk;
  // A shard buffer is busy from its chunk's reduce-scatter until its all-gather has read it:
  // max_inflight chunks crossing sites plus the one being reduce-scattered. (A gather still
  // running when its slot comes round again finishes before the next in-site reduce-scatter
  // anyway: operations on one group complete in issue order.)
  const int64_t slots = std::min<int64_t>(chunks, options_.max_inflight + 1);
  const int64_t shard = chunk / s;
  std::vector<char> shards(static_cast<size_t>(slots * shard * element));
  std::vector<WorkHandle> gathers(slots);
  std::vector<std::vector<int64_t>> gather_counts(slots, std::vector<int64_t>(s));
  std::vector<char> padded;  // the last chunk when its length is not a multiple of s

  struct Crossing {
    int64_t index;
    WorkHandle work;
  };
  std::deque<Crossing> crossing;

  auto chunk_length = [&](int64_t i) { return std::min(chunk, count - i * chunk); };
  // Block j of a chunk of `length` elements reduce-scattered in blocks of ceil(length / s):
  // how many of its elements are data rather than padding.
  auto block_count = [&](int64_t length, int64_t j) {
    const int64_t block = (length + s - 1) / s;
    return std::clamp<int64_t>(length - j * block, 0, block);
  };
  // Cross-site step done: gather the reduced shards straight into the data.
  auto retire = [&]() {
    Crossing done = crossing.front();
    crossing.pop_front();
    done.work->wait();
    const int64_t slot = done.index % slots;
    const int64_t length = chunk_length(done.index);
    for (int64_t j = 0; j < s; ++j) gather_counts[slot][j] = block_count(length, j);
    gathers[slot] = in_site_->all_gather_v_async(shards.data() + slot * shard * element,
                                                 data + done.index * chunk * element, gather_counts[slot], dtype);
  };

  // Chunk i: in-site reduce-scatter into a free shard buffer, then its cross-site all-reduce
  // in flight; the oldest crossing is gathered once more than max_inflight are.
  auto issue = [&](int64_t i) {
    const int64_t slot = i % slots;
    if (gathers[slot]) gathers[slot]->wait();  // its previous chunk has been read out
    const int64_t length = chunk_length(i);
    const int64_t block = (length + s - 1) / s;
    const char* send = data + i * chunk * element;
    if (length % s != 0) {
      // Zero padding: the padded elements are reduced and then dropped by the all-gather.
      padded.assign(static_cast<size_t>(block * s * element), 0);
      std::memcpy(padded.data(), send, static_cast<size_t>(length * element));
      send = padded.data();
    }
    char* mine = shards.data() + slot * shard * element;
    in_site_->reduce_scatter(send, mine, block, dtype, op);
    // Only the real elements of this rank's block cross sites; the cross-site group shares the
    // position, hence the block and its count.
    crossing.push_back({i, across_sites_->all_reduce_async(mine, block_count(length, position), dtype, op)});
    // Retire by count, never by polling: every rank must issue the in-site all-gathers and
    // reduce-scatters in the same order.
    if (static_cast<int>(crossing.size()) > options_.max_inflight) retire();
  };
  auto settle = [](const WorkHandle& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {  // the first error is the one rethrown
    }
  };

  try {
    for (int64_t i = 0; i < chunks; ++i) issue(i);
    while (!crossing.empty()) retire();
    for (const WorkHandle& gather : gathers) {
      if (gather) gather->wait();
    }
  } catch (...) {
    // Operations still pending may read or write `shards`: let each end (or fail) before the
    // buffers go away with the stack.
    for (const Crossing& c : crossing) settle(c.work);
    for (const WorkHandle& gather : gathers) settle(gather);
    throw;
  }
}

}  // namespace loom::comm
