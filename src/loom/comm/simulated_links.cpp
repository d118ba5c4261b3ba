#include "loom/comm/simulated_links.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "loom/core/error.h"

namespace loom::comm {

const LinkSpec& LinkSpecs::operator[](LinkClass link) const {
  switch (link) {
    case LinkClass::SameNode: return node;
    case LinkClass::SameSite: return site;
    case LinkClass::CrossSite: return cross_site;
  }
  return cross_site;
}

SimulatedLinks::SimulatedLinks(Topology topology, LinkSpecs specs) : topology_(std::move(topology)), specs_(specs) {
  for (LinkClass link : {LinkClass::SameNode, LinkClass::SameSite, LinkClass::CrossSite}) {
    const LinkSpec& s = specs_[link];
    LOOM_CHECK(s.latency_us >= 0 && s.bandwidth_gbps >= 0,
          "simulated links: " + link_class_name(link) + " latency " + std::to_string(s.latency_us) + " us, bandwidth " +
              std::to_string(s.bandwidth_gbps) + " Gb/s are invalid: both must be >= 0 (bandwidth 0 = unlimited)");
  }
  const size_t slots = static_cast<size_t>(topology_.world_size()) * kLinkClasses;
  sent_ = std::make_unique<std::atomic<int64_t>[]>(slots);
  egress_free_.assign(slots, Clock::time_point{});
  ingress_free_.assign(slots, Clock::time_point{});
}

void SimulatedLinks::transfer(int source, int destination, int64_t bytes) {
  LOOM_CHECK(source != destination, "simulated links: transfer from rank " + std::to_string(source) + " to itself");
  const LinkClass link = topology_.link(source, destination);
  const int c = static_cast<int>(link);
  bytes_[c].fetch_add(bytes, std::memory_order_relaxed);
  transfers_[c].fetch_add(1, std::memory_order_relaxed);
  sent_[slot(source, link)].fetch_add(bytes, std::memory_order_relaxed);

  const LinkSpec& spec = specs_[link];
  if (spec.latency_us == 0 && spec.bandwidth_gbps == 0) return;
  const auto latency =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::micro>(spec.latency_us));
  Clock::time_point arrival;
  if (spec.bandwidth_gbps == 0) {
    arrival = Clock::now() + latency;
  } else {
    const double seconds = static_cast<double>(bytes) * 8.0 / (spec.bandwidth_gbps * 1e9);
    const auto busy = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    std::lock_guard<std::mutex> lock(mutex_);
    Clock::time_point& out = egress_free_[slot(source, link)];
    Clock::time_point& in = ingress_free_[slot(destination, link)];
    const Clock::time_point start = std::max({Clock::now(), out, in});
    out = in = start + busy;
    arrival = start + busy + latency;
  }
  std::this_thread::sleep_until(arrival);
}

int64_t SimulatedLinks::bytes(LinkClass link) const { return bytes_[static_cast<int>(link)].load(); }

int64_t SimulatedLinks::transfers(LinkClass link) const { return transfers_[static_cast<int>(link)].load(); }

int64_t SimulatedLinks::bytes_sent(int rank, LinkClass link) const {
  LOOM_CHECK(rank >= 0 && rank < topology_.world_size(), "simulated links: rank " + std::to_string(rank) +
                                                        " is outside the world [0, " +
                                                        std::to_string(topology_.world_size()) + ")");
  return sent_[slot(rank, link)].load();
}

int64_t SimulatedLinks::max_bytes_sent(LinkClass link) const {
  int64_t most = 0;
  for (int r = 0; r < topology_.world_size(); ++r) most = std::max(most, bytes_sent(r, link));
  return most;
}

void SimulatedLinks::reset() {
  for (int c = 0; c < kLinkClasses; ++c) {
    bytes_[c] = 0;
    transfers_[c] = 0;
  }
  for (size_t i = 0; i < egress_free_.size(); ++i) sent_[i] = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(egress_free_.begin(), egress_free_.end(), Clock::time_point{});
  std::fill(ingress_free_.begin(), ingress_free_.end(), Clock::time_point{});
}

std::string SimulatedLinks::describe_traffic() const {
  std::ostringstream out;
  bool first = true;
  for (LinkClass link : {LinkClass::SameNode, LinkClass::SameSite, LinkClass::CrossSite}) {
    out << (first ? "" : ", ") << link_class_name(link) << " " << bytes(link) << " B in " << transfers(link)
        << " transfers";
    first = false;
  }
  return out.str();
}

}  // namespace loom::comm
