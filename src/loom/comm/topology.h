#pragma once
// Which world ranks share a node and which nodes share a site (data center), and the class of
// the link between two ranks. Hierarchical collectives use it to keep traffic inside a site;
// SimulatedLinks uses it to give each link class its latency and bandwidth.
//
// Sources: contiguous blocks of world ranks (config topology.ranks_per_node /
// topology.nodes_per_site, as Slurm and mpirun place ranks by default), or the hostnames the
// ranks run on (ranks on one host share a node). Sites are always blocks of nodes_per_site
// consecutive nodes, nodes numbered in order of their lowest rank.
#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"

namespace loom::comm {

enum class LinkClass : uint8_t { SameNode, SameSite, CrossSite };
inline constexpr int kLinkClasses = 3;
std::string link_class_name(LinkClass link);  // "node" | "site" | "cross_site"

class Topology {
 public:
  // node_of_rank[r] is world rank r's node; site_of_node[n] is node n's site. Nodes and sites
  // are numbered 0.. without gaps.
  Topology(std::vector<int> node_of_rank, std::vector<int> site_of_node);

  int world_size() const { return static_cast<int>(node_of_rank_.size()); }
  int nodes() const { return static_cast<int>(site_of_node_.size()); }
  int sites() const { return sites_; }
  int node_of(int rank) const;
  int site_of(int rank) const;
  LinkClass link(int a, int b) const;  // a != b
  // World ranks of each site, ascending.
  std::vector<std::vector<int>> site_ranks() const;

 private:
  std::vector<int> node_of_rank_;
  std::vector<int> site_of_node_;
  int sites_ = 0;
};

// Contiguous blocks: ranks_per_node consecutive ranks form a node (0 = all ranks one node),
// nodes_per_site consecutive nodes a site (0 = one site). Throws naming the sizes when they do
// not divide the world.
Topology topology_from_blocks(int world_size, int ranks_per_node, int nodes_per_site);
// hostnames[r] is world rank r's host; nodes_per_site as above (it must divide the node count).
Topology topology_from_hostnames(const std::vector<std::string>& hostnames, int nodes_per_site);
// Collective over `world`: ranks_per_node > 0 uses blocks, 0 gathers every rank's hostname.
Topology discover_topology(Communicator& world, int ranks_per_node, int nodes_per_site);

// "4 ranks, 2 nodes, 2 sites: site 0 = nodes 0 (ranks 0-1); site 1 = ..." for logs and `loom mesh`.
std::string describe_topology(const Topology& topology);

// The widest link class inside any of `groups` (world ranks): SameNode when every group stays
// on one node. Groups of one rank count as SameNode.
LinkClass widest_link(const Topology& topology, const std::vector<std::vector<int>>& groups);

}  // namespace loom::comm
