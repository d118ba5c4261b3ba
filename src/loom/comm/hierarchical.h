#pragma once
// Hierarchical all-reduce for groups that span sites (data centers) far apart, as NeMo's
// multi-data-center training does it: reduce-scatter inside each site, all-reduce of each shard
// across sites, all-gather inside each site. With N bytes per rank, S sites and s ranks of the
// group per site, each rank sends only 2 (S-1)/S * N/s bytes over the long-haul link, 2 (S-1) N
// in all; a flat ring over n = S s ranks placed site by site sends 2 (n-1)/n * N over each of
// its S site-crossing links, about s times more per long-haul port.
//
// The data is cut into chunks; the cross-site all-reduce of chunk i runs asynchronously while
// the in-site reduce-scatter of chunk i+1 and the all-gather of chunk i-1 proceed, so the
// long-haul latency is hidden behind in-site work (up to max_inflight chunks cross at once).
//
// Results equal the flat all-reduce up to reassociation. bf16/f16 data is reduced in its own
// dtype on the wire (that is the traffic saved), so it rounds twice, after the in-site and after
// the cross-site step, where a flat all-reduce rounds once.
#include <cstdint>
#include <memory>

#include "loom/comm/communicator.h"
#include "loom/comm/topology.h"

namespace loom::comm {

struct HierarchicalOptions {
  int64_t chunk_bytes = int64_t{4} << 20;  // per chunk of the data, before splitting into shards
  int max_inflight = 2;                    // cross-site all-reduces in flight at once
};

class HierarchicalAllReduce {
 public:
  // Collective over `group` (the world or e.g. a dp group). `topology` places world ranks; every
  // site must hold the same number of the group's ranks. Builds the in-site group (the group's
  // ranks of this rank's site, in group order) and the cross-site group (the ranks with the same
  // position in their site, one per site, in site order) with group.split.
  HierarchicalAllReduce(Communicator& group, const Topology& topology, HierarchicalOptions options = {});

  // In place, every rank of the group with the same count, dtype and op (like all_reduce).
  void all_reduce(void* data, int64_t count, DType dtype, ReduceOp op);

  int sites() const { return sites_; }
  int ranks_per_site() const { return ranks_per_site_; }
  Communicator& in_site() { return *in_site_; }
  Communicator& across_sites() { return *across_sites_; }

 private:
  void chunked(char* data, int64_t count, DType dtype, ReduceOp op);

  Communicator* group_;
  HierarchicalOptions options_;
  int sites_ = 0, ranks_per_site_ = 0;
  std::unique_ptr<Communicator> in_site_, across_sites_;
};

}  // namespace loom::comm
