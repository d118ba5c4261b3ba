#pragma once
// The cross-site leg of hierarchical data parallelism (site_groups.h), on a thread of its own.
//
// The training thread reduce-scatters a gradient bucket inside its site and hands the pending
// reduce-scatter to submit(); this thread waits for it, all-reduces the rank's shard across
// sites (the ranks with the same position in every site) and, for zero 0, all-gathers the
// reduced shards inside the site again (on an in-site group of its own, so each group is driven
// by one thread in one order on every rank). Buckets are taken in submission order, several
// cross-site all-reduces in flight at once, so the long-haul latency of one bucket overlaps the
// next buckets and the rest of backward. The handle submit() returns completes when the shard
// (and the gather) is done.
//
// Device shards: the worker's device work (a bf16 crossing's rounding and widening) goes on the
// compute queue of the rank that made the worker (core/compute_queue.h), in that rank's order of
// work after the waits that precede it on this thread, and its buffer is allocated here first
// (which makes the shard's device this thread's current one).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/tensor.h"

namespace loom::parallel {

// Bytes this rank sent per link class in the collectives of hierarchical data parallelism
// (each collective's own count: a ring reduce-scatter or all-gather over n ranks sends (n-1)/n
// of the buffer, an all-reduce twice that), and the time the training thread blocked on them.
struct SiteTraffic {
  int64_t in_site_bytes = 0;
  int64_t cross_site_bytes = 0;
  double wait_s = 0.0;
  SiteTraffic operator-(const SiteTraffic& o) const {
    return {in_site_bytes - o.in_site_bytes, cross_site_bytes - o.cross_site_bytes, wait_s - o.wait_s};
  }
};

struct CrossSiteJob {
  comm::WorkHandle in_site;  // the bucket's in-site reduce-scatter
  void* shard = nullptr;     // its result: this rank's shard, reduced in place across sites
  int64_t count = 0;         // real elements of the shard (padding never crosses)
  DType dtype = DType::F32;  // of the shard
  DType cross = DType::F32;  // what it travels in across sites (bf16 rounds an f32 shard)
  // Where the shard (and `gather_to`) live: on a GPU the rounding for a bf16 crossing runs
  // there, issued from the worker's thread after the in-site reduce-scatter has completed.
  Device device = Device::cpu();
  // Zero 0: all-gather every position's shard inside the site into `gather_to`.
  bool gather = false;
  void* gather_to = nullptr;
  std::vector<int64_t> gather_counts;
};

class CrossSiteWorker {
 public:
  // `across`: this rank's cross-site groups (channels, used in turn); `in_site_gather`: an
  // in-site group used only here (null when no job gathers). All outlive the worker.
  CrossSiteWorker(std::vector<comm::Communicator*> across, comm::Communicator* in_site_gather, int max_inflight = 8);
  ~CrossSiteWorker();
  CrossSiteWorker(const CrossSiteWorker&) = delete;
  CrossSiteWorker& operator=(const CrossSiteWorker&) = delete;

  comm::WorkHandle submit(CrossSiteJob job);
  // Cumulative bytes sent across sites and inside the site by this worker's collectives.
  int64_t cross_site_bytes() const { return cross_bytes_; }
  int64_t in_site_bytes() const { return gather_bytes_; }

 private:
  struct Pending;
  void run();
  void start(Pending& p);
  void retire(Pending& p);
  static bool crossed(const Pending& p);

  std::vector<comm::Communicator*> across_;
  size_t next_channel_ = 0;
  comm::Communicator* gather_group_;
  const int max_inflight_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Pending>> queue_;
  bool stop_ = false;
  std::exception_ptr failed_;  // the first failure: later jobs fail with it
  std::atomic<int64_t> cross_bytes_{0}, gather_bytes_{0};
  std::thread thread_;
};

}  // namespace loom::parallel
