#include "loom/parallel/data/cross_site_worker.h"

#include <chrono>

#include "loom/core/compute_queue.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data/communication.h"

namespace loom::parallel {

// One submitted job and its completion, shared by the worker and the handle.
struct CrossSiteWorker::Pending {
  CrossSiteJob job;
  comm::WorkHandle crossing;     // the cross-site all-reduce in flight
  Tensor narrow;                 // an f32 shard rounded for a bf16 crossing (on the shard's device)
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    error = e;
    done = true;
    done_cv.notify_all();
  }
};

namespace {

class JobWork final : public comm::Work {
 public:
  explicit JobWork(std::shared_ptr<void> keep, std::mutex& m, std::condition_variable& cv, const bool& done,
                   const std::exception_ptr& error)
      : keep_(std::move(keep)), m_(m), cv_(cv), done_(done), error_(error) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(m_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }

 private:
  std::shared_ptr<void> keep_;
  std::mutex& m_;
  std::condition_variable& cv_;
  const bool& done_;
  const std::exception_ptr& error_;
};

// Whether a started job's crossing has ended (an error counts: retire() rethrows it).
bool crossed_work(const comm::WorkHandle& w) {
  if (!w) return true;
  try {
    return w->test();
  } catch (...) {
    return true;
  }
}

int64_t ring_share(int64_t bytes, int ranks) { return ranks <= 1 ? 0 : bytes * (ranks - 1) / ranks; }

}  // namespace

CrossSiteWorker::CrossSiteWorker(std::vector<comm::Communicator*> across, comm::Communicator* in_site_gather,
                                 int max_inflight)
    : across_(std::move(across)), gather_group_(in_site_gather), max_inflight_(max_inflight),
      thread_([this, queue = compute_queue()] {
        ComputeQueueScope rank_queue(queue);  // the rank's device work in its one order
        run();
      }) {}

CrossSiteWorker::~CrossSiteWorker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

comm::WorkHandle CrossSiteWorker::submit(CrossSiteJob job) {
  auto p = std::make_shared<Pending>();
  p->job = std::move(job);
  auto work = std::make_shared<JobWork>(p, p->mutex, p->done_cv, p->done, p->error);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(p);
  }
  wake_.notify_all();
  return work;
}

void CrossSiteWorker::start(Pending& p) {
  CrossSiteJob& j = p.job;
  if (j.in_site) j.in_site->wait();  // none with one rank per site at zero 0
  void* data = j.shard;
  if (j.cross != j.dtype) {  // f32 shard, bf16 crossing: round here, widen in retire()
    p.narrow = Tensor({j.count}, j.cross, j.device);
    kernels::narrow_floats(j.device, p.narrow.raw(), static_cast<const float*>(j.shard), j.count, j.cross);
    data = p.narrow.raw();
  }
  comm::Communicator& channel = *across_[next_channel_++ % across_.size()];
  p.crossing = start_cross_site_all_reduce(channel, data, j.count, j.cross);
  cross_bytes_ += 2 * ring_share(j.count * static_cast<int64_t>(dtype_size(j.cross)), channel.size());
}

void CrossSiteWorker::retire(Pending& p) {
  CrossSiteJob& j = p.job;
  p.crossing->wait();
  if (!p.narrow.empty()) kernels::widen_floats(j.device, static_cast<float*>(j.shard), p.narrow.raw(), j.count, j.cross, false);
  if (j.gather) {
    start_shard_all_gather(*gather_group_, j.shard, j.gather_to, j.gather_counts, j.dtype)->wait();
    int64_t total = 0;
    for (int64_t c : j.gather_counts) total += c;
    gather_bytes_ += ring_share(total * static_cast<int64_t>(dtype_size(j.dtype)), gather_group_->size());
  }
}

bool CrossSiteWorker::crossed(const Pending& p) { return crossed_work(p.crossing); }

void CrossSiteWorker::run() {
  std::deque<std::shared_ptr<Pending>> inflight;
  auto fail_or_run = [&](Pending& p, void (CrossSiteWorker::*stage)(Pending&)) {
    if (failed_) return false;
    try {
      (this->*stage)(p);
      return true;
    } catch (...) {
      failed_ = std::current_exception();
      return false;
    }
  };
  while (true) {
    std::shared_ptr<Pending> next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || !queue_.empty() || !inflight.empty(); });
      if (queue_.empty() && inflight.empty()) return;  // stopping with nothing left
      // Nothing new to start and the oldest crossing still on the wire: poll it, waking for a new
      // bucket at once, so that a slow crossing never holds back the start of the next ones.
      if (queue_.empty() && static_cast<int>(inflight.size()) <= max_inflight_ && !crossed(*inflight.front())) {
        wake_.wait_for(lock, std::chrono::microseconds(500), [&] { return !queue_.empty(); });
        continue;
      }
      if (!queue_.empty()) {
        next = queue_.front();
        queue_.pop_front();
      }
    }
    if (next) {
      if (fail_or_run(*next, &CrossSiteWorker::start)) {
        inflight.push_back(next);
      } else {
        next->finish(failed_);
      }
      if (static_cast<int>(inflight.size()) <= max_inflight_) continue;
    }
    // Retire the oldest: at the window's limit, or once it has crossed.
    std::shared_ptr<Pending> oldest = inflight.front();
    inflight.pop_front();
    const bool ok = fail_or_run(*oldest, &CrossSiteWorker::retire);
    if (!ok && oldest->crossing) {
      try {  // the caller's buffer is in use until the crossing ends
        oldest->crossing->wait();
      } catch (...) {
      }
    }
    oldest->finish(ok ? nullptr : failed_);
  }
}

}  // namespace loom::parallel
