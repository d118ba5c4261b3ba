// Topology from config blocks and from hostnames, link classes, and SimulatedLinks' accounting
// and delays (tiny latencies keep it fast).
#include "loom/comm/topology.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/comm/mesh.h"
#include "loom/comm/simulated_links.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST(Topology, FromBlocks) {
  // 8 ranks, 2 per node, 2 nodes per site: nodes [0 1] [2 3] [4 5] [6 7], sites {0-3} {4-7}.
  Topology t = topology_from_blocks(8, 2, 2);
  EXPECT_EQ(t.world_size(), 8);
  EXPECT_EQ(t.nodes(), 4);
  EXPECT_EQ(t.sites(), 2);
  EXPECT_EQ(t.node_of(5), 2);
  EXPECT_EQ(t.site_of(3), 0);
  EXPECT_EQ(t.site_of(4), 1);
  EXPECT_EQ(t.link(0, 1), LinkClass::SameNode);
  EXPECT_EQ(t.link(1, 2), LinkClass::SameSite);
  EXPECT_EQ(t.link(3, 4), LinkClass::CrossSite);
  EXPECT_EQ(t.link(7, 0), LinkClass::CrossSite);
  EXPECT_EQ(t.site_ranks(), (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(describe_topology(t),
            "topology: 8 ranks, 4 nodes, 2 sites\nsite 0: node 0 [0 1] node 1 [2 3]\n"
            "site 1: node 2 [4 5] node 3 [6 7]\n");
}

TEST(Topology, DefaultsAreOneNodeOneSite) {
  Topology t = topology_from_blocks(6, 0, 0);
  EXPECT_EQ(t.nodes(), 1);
  EXPECT_EQ(t.sites(), 1);
  EXPECT_EQ(t.link(0, 5), LinkClass::SameNode);
  Topology sites = topology_from_blocks(6, 3, 0);  // two nodes, one site
  EXPECT_EQ(sites.link(2, 3), LinkClass::SameSite);
}

TEST(Topology, Errors) {
  EXPECT_HAS(error_of([] { topology_from_blocks(8, 3, 0); }),
             "topology.ranks_per_node = 3 does not divide the world size 8");
  EXPECT_HAS(error_of([] { topology_from_blocks(8, 2, 3); }),
             "topology.nodes_per_site = 3 does not divide the 4 nodes");
  EXPECT_HAS(error_of([] { topology_from_blocks(8, -1, 0); }), "must be >= 0");
  EXPECT_HAS(error_of([] {
               topology_from_hostnames({"a", "b", "c"}, 2);
             }),
             "nodes_per_site = 2 does not divide the 3 nodes");
}

TEST(Topology, FromHostnames) {
  // Ranks placed round-robin over three hosts; nodes numbered by first appearance.
  Topology t = topology_from_hostnames({"gpu-a", "gpu-b", "gpu-c", "gpu-a", "gpu-b", "gpu-c"}, 0);
  EXPECT_EQ(t.nodes(), 3);
  EXPECT_EQ(t.sites(), 1);
  EXPECT_EQ(t.node_of(3), 0);
  EXPECT_EQ(t.node_of(5), 2);
  EXPECT_EQ(t.link(0, 3), LinkClass::SameNode);
  EXPECT_EQ(t.link(0, 1), LinkClass::SameSite);
  // Four hosts, two per site: hosts a, b in site 0 and c, d in site 1.
  Topology two = topology_from_hostnames({"a", "a", "b", "b", "c", "c", "d", "d"}, 2);
  EXPECT_EQ(two.sites(), 2);
  EXPECT_EQ(two.link(1, 2), LinkClass::SameSite);
  EXPECT_EQ(two.link(3, 4), LinkClass::CrossSite);
}

TEST(Topology, DiscoverOnThreadsBackend) {
  LaunchOptions options;
  options.ranks = 4;
  options.comm.timeout = std::chrono::seconds(20);
  launch(options, [](Communicator& world) {
    // Threads share one host: one node.
    Topology from_hosts = discover_topology(world, 0, 0);
    EXPECT_EQ(from_hosts.world_size(), 4);
    EXPECT_EQ(from_hosts.nodes(), 1);
    Topology from_config = discover_topology(world, 1, 2);
    EXPECT_EQ(from_config.sites(), 2);
    EXPECT_EQ(from_config.link(1, 2), LinkClass::CrossSite);
  });
}

TEST(Topology, WidestLinkOfMeshGroups) {
  // 8 ranks, 2 per node, 2 nodes per site; tp 2 x dp 2 x pp 2: tp stays in a node, dp crosses
  // nodes inside a site, pp crosses sites.
  Topology t = topology_from_blocks(8, 2, 2);
  MeshLayout l = make_mesh_layout(8, {.tp = 2, .pp = 2});
  EXPECT_EQ(widest_link(t, l.groups["tp"]), LinkClass::SameNode);
  EXPECT_EQ(widest_link(t, l.groups["dp"]), LinkClass::SameSite);
  EXPECT_EQ(widest_link(t, l.groups["pp"]), LinkClass::CrossSite);
  EXPECT_EQ(widest_link(t, l.groups["cp"]), LinkClass::SameNode);
}

TEST(SimulatedLinks, CountsBytesPerClassAndRank) {
  SimulatedLinks links(topology_from_blocks(4, 1, 2), {});  // nodes of one rank, sites {0 1} {2 3}
  links.transfer(0, 1, 100);
  links.transfer(1, 2, 40);
  links.transfer(3, 0, 7);
  links.transfer(0, 3, 5);
  EXPECT_EQ(links.bytes(LinkClass::SameNode), 0);
  EXPECT_EQ(links.bytes(LinkClass::SameSite), 100);
  EXPECT_EQ(links.bytes(LinkClass::CrossSite), 52);
  EXPECT_EQ(links.transfers(LinkClass::CrossSite), 3);
  EXPECT_EQ(links.bytes_sent(3, LinkClass::CrossSite), 7);
  EXPECT_EQ(links.bytes_sent(1, LinkClass::CrossSite), 40);
  EXPECT_EQ(links.max_bytes_sent(LinkClass::CrossSite), 40);
  EXPECT_EQ(links.describe_traffic(),
            "node 0 B in 0 transfers, site 100 B in 1 transfers, cross_site 52 B in 3 transfers");
  links.reset();
  EXPECT_EQ(links.bytes(LinkClass::CrossSite), 0);
  EXPECT_EQ(links.max_bytes_sent(LinkClass::SameSite), 0);
  EXPECT_HAS(error_of([&] { links.transfer(2, 2, 1); }), "to itself");
  LinkSpecs negative;
  negative.site.latency_us = -1;
  EXPECT_HAS(error_of([&] { SimulatedLinks bad(topology_from_blocks(2, 1, 0), negative); }), "must be >= 0");
}

double seconds_of(const std::function<void()>& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(SimulatedLinks, DelaysByLatencyAndBandwidth) {
  // Cross-site: 2 ms latency, 8 Gb/s = 1 GB/s per port. Same site: unlimited.
  LinkSpecs specs;
  specs.cross_site = {.latency_us = 2000, .bandwidth_gbps = 8};
  SimulatedLinks links(topology_from_blocks(4, 1, 2), specs);
  EXPECT_LT(seconds_of([&] { links.transfer(0, 1, 1 << 20); }), 0.002);  // same site: free
  // 1 MB at 1 GB/s = 1 ms, plus 2 ms latency.
  double one = seconds_of([&] { links.transfer(0, 2, 1000000); });
  EXPECT_GE(one, 0.003);
  EXPECT_LT(one, 0.5);  // upper bounds only catch gross errors: the machine may be busy
  // Two transfers out of rank 0 at once share its port: the second leaves after the first, so
  // both finish after 2 ms of transmission + 2 ms latency; latency itself overlaps.
  links.reset();
  double both = seconds_of([&] {
    std::thread a([&] { links.transfer(0, 2, 1000000); });
    std::thread b([&] { links.transfer(0, 3, 1000000); });
    a.join();
    b.join();
  });
  EXPECT_GE(both, 0.004);
  EXPECT_LT(both, 0.5);
  // Into one rank from two: its ingress port is shared the same way.
  links.reset();
  double into = seconds_of([&] {
    std::thread a([&] { links.transfer(0, 2, 1000000); });
    std::thread b([&] { links.transfer(1, 2, 1000000); });
    a.join();
    b.join();
  });
  EXPECT_GE(into, 0.004);
  EXPECT_LT(into, 0.5);
}

}  // namespace
}  // namespace loom::comm
