#pragma once
// SimulatedLinks: a LinkModel that makes the threads backend behave like a multi-node,
// multi-site cluster, and counts the bytes that cross each link class.
//
// The model. Every rank has one full-duplex port per link class (think NVLink for the node, its
// NIC for the site and the long-haul link): an egress queue and an ingress queue, each moving
// bandwidth bytes per second. A transfer of B bytes from s to d over class c waits until both
// s's egress and d's ingress port of class c are free, holds both for B / bandwidth, and
// arrives `latency` after it leaves, so latency overlaps with other transfers (many messages can
// be in flight on a long-haul link) while bandwidth is shared: two transfers out of one rank take
// twice as long as one. transfer() sleeps the calling thread until the bytes arrive.
// Bandwidth 0 means unlimited; latency 0 means none.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/link_model.h"
#include "loom/comm/topology.h"

namespace loom::comm {

struct LinkSpec {
  double latency_us = 0;      // one way
  double bandwidth_gbps = 0;  // per rank port, gigabits per second; 0 = unlimited
};

struct LinkSpecs {
  LinkSpec node, site, cross_site;
  const LinkSpec& operator[](LinkClass link) const;
};

class SimulatedLinks final : public LinkModel {
 public:
  SimulatedLinks(Topology topology, LinkSpecs specs);

  void transfer(int source, int destination, int64_t bytes) override;

  const Topology& topology() const { return topology_; }
  const LinkSpecs& specs() const { return specs_; }
  // Totals since construction or the last reset().
  int64_t bytes(LinkClass link) const;
  int64_t transfers(LinkClass link) const;
  // Bytes world rank `rank` sent over `link`, and the most any one rank sent (the busiest port).
  int64_t bytes_sent(int rank, LinkClass link) const;
  int64_t max_bytes_sent(LinkClass link) const;
  // Zeroes the counters and frees every port; call while no transfer is in flight.
  void reset();
  // "node 0 B in 0 transfers, site ..., cross_site ..." for logs and benchmarks.
  std::string describe_traffic() const;

 private:
  using Clock = std::chrono::steady_clock;
  size_t slot(int rank, LinkClass link) const {
    return static_cast<size_t>(rank) * kLinkClasses + static_cast<int>(link);
  }

  Topology topology_;
  LinkSpecs specs_;
  std::atomic<int64_t> bytes_[kLinkClasses] = {};
  std::atomic<int64_t> transfers_[kLinkClasses] = {};
  std::unique_ptr<std::atomic<int64_t>[]> sent_;               // per (rank, class)
  std::mutex mutex_;                                           // guards the port timelines
  std::vector<Clock::time_point> egress_free_, ingress_free_;  // per (rank, class)
};

}  // namespace loom::comm
