#include "loom/comm/topology.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <sstream>

#include "loom/core/error.h"

namespace loom::comm {

std::string link_class_name(LinkClass link) {
  switch (link) {
    case LinkClass::SameNode: return "node";
    case LinkClass::SameSite: return "site";
    case LinkClass::CrossSite: return "cross_site";
  }
  return "?";
}

Topology::Topology(std::vector<int> node_of_rank, std::vector<int> site_of_node)
    : node_of_rank_(std::move(node_of_rank)), site_of_node_(std::move(site_of_node)) {
  LOOM_CHECK(!node_of_rank_.empty(), "topology: no ranks");
  const int nodes = static_cast<int>(site_of_node_.size());
  std::vector<bool> node_used(nodes, false);
  for (size_t r = 0; r < node_of_rank_.size(); ++r) {
    const int n = node_of_rank_[r];
    LOOM_CHECK(n >= 0 && n < nodes, "topology: rank " + std::to_string(r) + " is on node " + std::to_string(n) +
                                   " but there are " + std::to_string(nodes) + " nodes (valid: 0.." +
                                   std::to_string(nodes - 1) + ")");
    node_used[n] = true;
  }
  for (int n = 0; n < nodes; ++n) {
    LOOM_CHECK(node_used[n], "topology: node " + std::to_string(n) + " has no ranks");
    sites_ = std::max(sites_, site_of_node_[n] + 1);
    LOOM_CHECK(site_of_node_[n] >= 0, "topology: node " + std::to_string(n) + " has a negative site");
  }
  std::vector<bool> site_used(sites_, false);
  for (int s : site_of_node_) site_used[s] = true;
  for (int s = 0; s < sites_; ++s) LOOM_CHECK(site_used[s], "topology: site " + std::to_string(s) + " has no nodes");
}

int Topology::node_of(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_size(),
        "topology: rank " + std::to_string(rank) + " is outside the world [0, " + std::to_string(world_size()) + ")");
  return node_of_rank_[rank];
}

int Topology::site_of(int rank) const { return site_of_node_[node_of(rank)]; }

LinkClass Topology::link(int a, int b) const {
  if (node_of(a) == node_of(b)) return LinkClass::SameNode;
  if (site_of(a) == site_of(b)) return LinkClass::SameSite;
  return LinkClass::CrossSite;
}

std::vector<std::vector<int>> Topology::site_ranks() const {
  std::vector<std::vector<int>> out(sites_);
  for (int r = 0; r < world_size(); ++r) out[site_of(r)].push_back(r);
  return out;
}

namespace {

std::vector<int> sites_of_nodes(int nodes, int nodes_per_site, const std::string& context) {
  LOOM_CHECK(nodes_per_site >= 0,
        "topology.nodes_per_site = " + std::to_string(nodes_per_site) + " is invalid: must be >= 0 (0 = one site)");
  if (nodes_per_site == 0) nodes_per_site = nodes;
  LOOM_CHECK(nodes % nodes_per_site == 0, "topology.nodes_per_site = " + std::to_string(nodes_per_site) +
                                         " does not divide the " + std::to_string(nodes) + " nodes (" + context +
                                         "); every site needs the same number of nodes");
  std::vector<int> site(nodes);
  for (int n = 0; n < nodes; ++n) site[n] = n / nodes_per_site;
  return site;
}

}  // namespace

Topology topology_from_blocks(int world_size, int ranks_per_node, int nodes_per_site) {
  LOOM_CHECK(world_size >= 1, "topology: world size must be >= 1, got " + std::to_string(world_size));
  LOOM_CHECK(ranks_per_node >= 0, "topology.ranks_per_node = " + std::to_string(ranks_per_node) +
                                 " is invalid: must be >= 0 (0 = all ranks on one node)");
  if (ranks_per_node == 0) ranks_per_node = world_size;
  LOOM_CHECK(world_size % ranks_per_node == 0, "topology.ranks_per_node = " + std::to_string(ranks_per_node) +
                                              " does not divide the world size " + std::to_string(world_size));
  const int nodes = world_size / ranks_per_node;
  std::vector<int> node(world_size);
  for (int r = 0; r < world_size; ++r) node[r] = r / ranks_per_node;
  return Topology(std::move(node), sites_of_nodes(nodes, nodes_per_site,
                                                  std::to_string(world_size) + " ranks / " +
                                                      std::to_string(ranks_per_node) + " ranks per node"));
}

Topology topology_from_hostnames(const std::vector<std::string>& hostnames, int nodes_per_site) {
  LOOM_CHECK(!hostnames.empty(), "topology: no hostnames");
  std::map<std::string, int> node_of_host;
  std::vector<int> node(hostnames.size());
  for (size_t r = 0; r < hostnames.size(); ++r) {
    auto [it, added] = node_of_host.emplace(hostnames[r], static_cast<int>(node_of_host.size()));
    node[r] = it->second;
  }
  const int nodes = static_cast<int>(node_of_host.size());
  return Topology(std::move(node), sites_of_nodes(nodes, nodes_per_site, "nodes found from the ranks' hostnames"));
}

Topology discover_topology(Communicator& world, int ranks_per_node, int nodes_per_site) {
  if (ranks_per_node > 0) return topology_from_blocks(world.size(), ranks_per_node, nodes_per_site);
  // Fixed-size records so one all-gather suffices; hostnames are at most HOST_NAME_MAX bytes.
  constexpr int kRecord = 256;
  static_assert(HOST_NAME_MAX < kRecord);
  std::vector<char> mine(kRecord, '\0');
  LOOM_CHECK(gethostname(mine.data(), kRecord - 1) == 0,
        std::string("topology: gethostname failed: ") + std::strerror(errno));
  std::vector<char> all(static_cast<size_t>(kRecord) * world.size());
  world.all_gather(mine.data(), all.data(), kRecord / 4, DType::I32);
  std::vector<std::string> hostnames(world.size());
  for (int r = 0; r < world.size(); ++r) hostnames[r] = std::string(all.data() + static_cast<size_t>(r) * kRecord);
  return topology_from_hostnames(hostnames, nodes_per_site);
}

namespace {

// "0-3" for a run of consecutive ranks, "0 2 5" otherwise.
std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  bool contiguous = ranks.size() > 2;
  for (size_t i = 1; i < ranks.size() && contiguous; ++i) contiguous = ranks[i] == ranks[i - 1] + 1;
  if (contiguous) {
    out << ranks.front() << "-" << ranks.back();
  } else {
    for (size_t i = 0; i < ranks.size(); ++i) out << (i ? " " : "") << ranks[i];
  }
  return out.str();
}

}  // namespace

std::string describe_topology(const Topology& t) {
  std::ostringstream out;
  out << "topology: " << t.world_size() << " ranks, " << t.nodes() << (t.nodes() == 1 ? " node, " : " nodes, ")
      << t.sites() << (t.sites() == 1 ? " site" : " sites") << "\n";
  std::vector<std::vector<int>> ranks_of_node(t.nodes());
  for (int r = 0; r < t.world_size(); ++r) ranks_of_node[t.node_of(r)].push_back(r);
  for (int s = 0; s < t.sites(); ++s) {
    out << "site " << s << ":";
    for (int n = 0; n < t.nodes(); ++n) {
      if (t.site_of(ranks_of_node[n].front()) == s) out << " node " << n << " [" << rank_list(ranks_of_node[n]) << "]";
    }
    out << "\n";
  }
  return out.str();
}

LinkClass widest_link(const Topology& topology, const std::vector<std::vector<int>>& groups) {
  LinkClass widest = LinkClass::SameNode;
  for (const auto& group : groups) {
    for (size_t i = 1; i < group.size(); ++i) widest = std::max(widest, topology.link(group.front(), group[i]));
  }
  return widest;
}

}  // namespace loom::comm
