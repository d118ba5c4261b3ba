// Hierarchical all-reduce on the threads backend: equal to the flat all-reduce for every dtype,
// op and awkward size (2 sites x 2 ranks, 2 sites x 4 ranks, and a dp group of a mesh), and
// under a simulated two-site topology it moves at most (S-1)/S of the flat traffic across sites.
#include "loom/comm/hierarchical.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/comm/mesh.h"
#include "loom/comm/reduce.h"
#include "loom/comm/simulated_links.h"
#include "loom/comm/topology.h"
#include "loom/core/error.h"

namespace loom::comm {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: a cheap counter-based random number
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank r's element i: a random integer in [-8, 8]. Sums of up to 8 ranks stay within 64 and
// averages over powers of two are short binary fractions, all exact in f32, bf16 and f16, so
// every correct reduction order gives the same bits and results are compared exactly.
float integer_value(int rank, int64_t i, uint64_t seed) {
  return static_cast<float>(
      static_cast<int>(mix(seed ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(i)) % 17) - 8);
}

// Rank r's element i: uniform in [-1, 1): reassociation shows.
float real_value(int rank, int64_t i, uint64_t seed) {
  return static_cast<float>(mix(seed ^ (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(i)) >> 40) /
             static_cast<float>(1 << 23) -
         1.0f;
}

std::vector<std::byte> encode(const std::vector<float>& values, DType dtype) {
  std::vector<std::byte> out(values.size() * dtype_size(dtype));
  from_f32(out.data(), values.data(), static_cast<int64_t>(values.size()), dtype);
  return out;
}

std::vector<float> decode(const std::vector<std::byte>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / dtype_size(dtype));
  to_f32(out.data(), bytes.data(), static_cast<int64_t>(out.size()), dtype);
  return out;
}

const std::vector<int64_t> kSizes = {0, 1, 13, 1009, 262147};  // 262147 f32 = 1 MiB + 12 B, prime
const std::vector<DType> kDtypes = {DType::F32, DType::BF16, DType::F16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// Small chunks so that even 1009 elements take several, with an uneven last one.
const HierarchicalOptions kTestChunks{.chunk_bytes = 64 << 10, .max_inflight = 2};

// On every rank of `group`: hierarchical == flat == serial reference for integer data, every
// dtype, op and size.
void expect_equal_to_flat(Communicator& group, HierarchicalAllReduce& h, uint64_t seed) {
  const std::vector<int>& members = group.world_ranks();
  for (int64_t count : kSizes) {
    std::vector<float> mine(count), sum(count, 0.0f), max(count, -1e30f);
    for (int64_t i = 0; i < count; ++i) {
      mine[i] = integer_value(group.rank(), i, seed);
      for (int r = 0; r < group.size(); ++r) {
        const float v = integer_value(r, i, seed);
        sum[i] += v;
        max[i] = std::max(max[i], v);
      }
    }
    for (DType dtype : kDtypes) {
      for (ReduceOp op : kOps) {
        std::vector<std::byte> flat = encode(mine, dtype), hier = flat;
        group.all_reduce(flat.data(), count, dtype, op);
        h.all_reduce(hier.data(), count, dtype, op);
        const std::vector<float> f = decode(flat, dtype), got = decode(hier, dtype);
        int64_t bad = 0;
        for (int64_t i = 0; i < count; ++i) {
          const float want = op == ReduceOp::Sum ? sum[i] : op == ReduceOp::Max ? max[i] : sum[i] / group.size();
          if (got[i] != want || f[i] != want) {
            if (++bad <= 3)
              ADD_FAILURE() << "group " << group.name() << " (world ranks " << members.front() << "..) rank "
                            << group.rank() << " " << dtype_name(dtype) << " " << reduce_op_name(op) << " count "
                            << count << " element " << i << ": hierarchical " << got[i] << ", flat " << f[i]
                            << ", reference " << want;
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

struct SiteShape {
  int sites, per_site;
};

class HierarchicalVsFlat : public ::testing::TestWithParam<SiteShape> {};

TEST_P(HierarchicalVsFlat, EveryDtypeOpAndSize) {
  const SiteShape shape = GetParam();
  const int world_size = shape.sites * shape.per_site;
  // Two ranks per node, per_site / 2 nodes per site.
  const Topology topology = topology_from_blocks(world_size, 2, shape.per_site / 2);
  ASSERT_EQ(topology.sites(), shape.sites);
  LaunchOptions options;
  options.ranks = world_size;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    HierarchicalAllReduce h(world, topology, kTestChunks);
    EXPECT_EQ(h.sites(), shape.sites);
    EXPECT_EQ(h.ranks_per_site(), shape.per_site);
    EXPECT_EQ(h.in_site().size(), shape.per_site);
    EXPECT_EQ(h.across_sites().size(), shape.sites);
    // In-site members: this rank's site; cross-site: the same position in every site.
    const int site = world.rank() / shape.per_site, position = world.rank() % shape.per_site;
    for (int j = 0; j < shape.per_site; ++j) EXPECT_EQ(h.in_site().world_ranks()[j], site * shape.per_site + j);
    for (int k = 0; k < shape.sites; ++k) EXPECT_EQ(h.across_sites().world_ranks()[k], k * shape.per_site + position);
    expect_equal_to_flat(world, h, 0x5EED);
  });
}

INSTANTIATE_TEST_SUITE_P(Sites, HierarchicalVsFlat, ::testing::Values(SiteShape{2, 2}, SiteShape{2, 4}),
                         [](const auto& info) {
                           return std::to_string(info.param.sites) + "x" + std::to_string(info.param.per_site);
                         });

TEST(Hierarchical, RealValuesWithinReassociation) {
  // Random reals: f32 within reassociation of 8 terms; bf16 rounds once more in the middle, so
  // within one bf16 rounding of the partial sums (|partial| <= 8).
  const Topology topology = topology_from_blocks(8, 2, 2);
  LaunchOptions options;
  options.ranks = 8;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    HierarchicalAllReduce h(world, topology, kTestChunks);
    const int64_t count = 100003;
    std::vector<float> mine(count);
    for (int64_t i = 0; i < count; ++i) mine[i] = real_value(world.rank(), i, 77);
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
        std::vector<std::byte> flat = encode(mine, dtype), hier = flat;
        world.all_reduce(flat.data(), count, dtype, op);
        h.all_reduce(hier.data(), count, dtype, op);
        const std::vector<float> f = decode(flat, dtype), got = decode(hier, dtype);
        const double scale = op == ReduceOp::Sum ? 8.0 : 1.0;
        const double tolerance =
            dtype == DType::F32 ? 8 * 8 * std::ldexp(1.0, -24) * scale : 2 * std::ldexp(1.0, -8) * scale;
        double worst = 0;
        for (int64_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(static_cast<double>(got[i]) - f[i]));
        EXPECT_LE(worst, tolerance) << dtype_name(dtype) << " " << reduce_op_name(op);
      }
    }
  });
}

// A dp group that spans two sites: world 8 = tp 2 x dp 4, sites {0-3} {4-7}; dp group [0 2 4 6]
// has ranks 0, 2 in site 0 and 4, 6 in site 1.
TEST(Hierarchical, OverMeshDpGroup) {
  const Topology topology = topology_from_blocks(8, 2, 2);
  LaunchOptions options;
  options.ranks = 8;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    Mesh mesh(world, {.tp = 2});
    HierarchicalAllReduce h(mesh.dp(), topology, kTestChunks);
    EXPECT_EQ(h.sites(), 2);
    EXPECT_EQ(h.ranks_per_site(), 2);
    const int tp = mesh.tp_rank();
    EXPECT_EQ(h.across_sites().world_ranks(),
              (std::vector<int>{tp + 2 * (mesh.dp_rank() % 2), tp + 4 + 2 * (mesh.dp_rank() % 2)}));
    expect_equal_to_flat(mesh.dp(), h, 0xD9 + static_cast<uint64_t>(tp));
  });
}

TEST(Hierarchical, OneSiteOrOneRankPerSite) {
  LaunchOptions options;
  options.ranks = 4;
  options.comm.timeout = std::chrono::seconds(60);
  launch(options, [&](Communicator& world) {
    for (const Topology& topology : {topology_from_blocks(4, 0, 0), topology_from_blocks(4, 1, 1)}) {
      HierarchicalAllReduce h(world, topology, kTestChunks);
      EXPECT_EQ(h.sites() * h.ranks_per_site(), 4);
      expect_equal_to_flat(world, h, 3);
    }
  });
}

TEST(Hierarchical, UnevenSitesAreAnError) {
  LaunchOptions options;
  options.ranks = 4;
  options.comm.timeout = std::chrono::seconds(20);
  launch(options, [&](Communicator& world) {
    const Topology topology = topology_from_hostnames({"a", "a", "a", "b"}, 1);
    try {
      HierarchicalAllReduce h(world, topology);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("has 3 in site 0, 1 in site 1; every site needs the same number"),
                std::string::npos)
          << e.what();
    }
  });
}

// Cross-site bytes under a simulated two-site topology, as the threads backend moves them.
//
// N bytes per rank, n ranks, S sites of s ranks (placed site by site), f32 Sum.
// - Flat ring over the world order 0 -> 1 -> ... -> n-1 -> 0 (analytic): each link carries
//   2 (n-1)/n * N (reduce-scatter then all-gather); S links cross sites, so
//   S * 2 (n-1)/n * N cross in all, 2 (n-1)/n * N through each crossing rank's port.
// - Flat, measured: whatever the threads backend's own all-reduce moves (it reads peers'
//   slices directly, so more than the ring).
// - Hierarchical, measured: only the cross-site all-reduce of each rank's 1/s shard crosses:
//   2 (S-1)/S * N/s per rank, 2 (S-1) * N in all.
// Asserted: hierarchical total == 2 (S-1) N; hierarchical total <= (S-1)/S * flat measured;
// hierarchical busiest port <= (S-1)/S * the ring's crossing port. Against the ring's *total*
// the ratio is (S-1)/S * n/(n-1) (2/3 for 2x2, 4/7 for 2x4): a site-ordered ring already
// crosses only S links, so the total bound holds only up to that n/(n-1).
struct Traffic {
  int64_t flat_cross = 0, flat_site = 0, flat_node = 0;
  int64_t hier_cross = 0, hier_site = 0, hier_node = 0, hier_busiest = 0;
};

TEST(Hierarchical, CrossSiteTraffic) {
  for (SiteShape shape : {SiteShape{2, 2}, SiteShape{2, 4}}) {
    const int n = shape.sites * shape.per_site, S = shape.sites, s = shape.per_site;
    const Topology topology = topology_from_blocks(n, 2, s / 2);
    LinkSpecs specs;
    specs.site = {.latency_us = 2, .bandwidth_gbps = 0};
    specs.cross_site = {.latency_us = 20, .bandwidth_gbps = 0};  // tiny: the test counts, not times
    auto links = std::make_shared<SimulatedLinks>(topology, specs);
    const int64_t count = 1 << 18;  // 1 MiB of f32 per rank
    const int64_t N = count * 4;
    Traffic t;
    LaunchOptions options;
    options.ranks = n;
    options.comm.timeout = std::chrono::seconds(60);
    options.link_model = links;
    launch(options, [&](Communicator& world) {
      HierarchicalAllReduce h(world, topology, {.chunk_bytes = 128 << 10, .max_inflight = 2});
      std::vector<float> data(count);
      for (int64_t i = 0; i < count; ++i) data[i] = integer_value(world.rank(), i, 9);
      std::vector<float> copy = data;
      // Counters are reset and read between barriers, when no transfer is in flight.
      world.barrier();
      if (world.rank() == 0) links->reset();
      world.barrier();
      world.all_reduce(data.data(), count, DType::F32, ReduceOp::Sum);
      world.barrier();
      if (world.rank() == 0) {
        t.flat_cross = links->bytes(LinkClass::CrossSite);
        t.flat_site = links->bytes(LinkClass::SameSite);
        t.flat_node = links->bytes(LinkClass::SameNode);
        links->reset();
      }
      world.barrier();
      h.all_reduce(copy.data(), count, DType::F32, ReduceOp::Sum);
      world.barrier();
      if (world.rank() == 0) {
        t.hier_cross = links->bytes(LinkClass::CrossSite);
        t.hier_site = links->bytes(LinkClass::SameSite);
        t.hier_node = links->bytes(LinkClass::SameNode);
        t.hier_busiest = links->max_bytes_sent(LinkClass::CrossSite);
      }
      EXPECT_EQ(copy, data);
    });
    const double ring_link = 2.0 * (n - 1) / n * static_cast<double>(N);
    const double ring_total = S * ring_link;
    const double fraction = static_cast<double>(S - 1) / S;
    std::printf(
        "[traffic] %d sites x %d ranks, N = %lld B per rank (f32 sum)\n"
        "  flat ring, analytic:   cross_site %.0f B = S * 2(n-1)/n * N (%.0f B per crossing link)\n"
        "  flat, threads backend: cross_site %lld B, site %lld B, node %lld B\n"
        "  hierarchical:          cross_site %lld B = %.3f N, busiest rank %lld B, site %lld B, node %lld B\n"
        "  hierarchical / flat measured = %.3f, / ring total = %.3f, busiest / ring link = %.3f; (S-1)/S = %.3f\n",
        S, s, static_cast<long long>(N), ring_total, ring_link, static_cast<long long>(t.flat_cross),
        static_cast<long long>(t.flat_site), static_cast<long long>(t.flat_node), static_cast<long long>(t.hier_cross),
        static_cast<double>(t.hier_cross) / N, static_cast<long long>(t.hier_busiest),
        static_cast<long long>(t.hier_site), static_cast<long long>(t.hier_node),
        static_cast<double>(t.hier_cross) / t.flat_cross, t.hier_cross / ring_total, t.hier_busiest / ring_link,
        fraction);
    EXPECT_EQ(t.hier_cross, 2 * (S - 1) * N);
    EXPECT_LE(static_cast<double>(t.hier_cross), fraction * static_cast<double>(t.flat_cross));
    EXPECT_LE(static_cast<double>(t.hier_busiest), fraction * ring_link);
    EXPECT_EQ(t.hier_busiest, 2 * (S - 1) * N / (S * s));
  }
}

}  // namespace
}  // namespace loom::comm
