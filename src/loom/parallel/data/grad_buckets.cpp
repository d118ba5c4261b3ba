#include "loom/parallel/data/grad_buckets.h"

#include <algorithm>
#include <cstring>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data/communication.h"
#include "loom/parallel/data/sync_setup.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

int64_t BucketLayout::numel() const {
  int64_t n = 0;
  for (const Bucket& b : buckets) n += b.numel;
  return n;
}

int64_t BucketLayout::padded_numel() const {
  int64_t n = 0;
  for (const Bucket& b : buckets) n += b.padded_numel;
  return n;
}

int64_t BucketLayout::owned_numel(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < shard_ranks, "BucketLayout: rank " + std::to_string(rank) + " is not in 0.." +
                                             std::to_string(shard_ranks - 1));
  int64_t n = 0;
  for (const Bucket& b : buckets) n += b.shards[rank].size();
  return n;
}

BucketLayout make_buckets(const std::vector<ParamRange>& params, int64_t bucket_bytes, int shard_ranks) {
  LOOM_CHECK(bucket_bytes > 0, "make_buckets: bucket_bytes must be > 0 (got " + std::to_string(bucket_bytes) + ")");
  LOOM_CHECK(shard_ranks > 0, "make_buckets: shard_ranks must be > 0 (got " + std::to_string(shard_ranks) + ")");
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamRange& p = params[i];
    LOOM_CHECK(p.numel >= 0, "make_buckets: parameter " + std::to_string(i) + " has numel " + std::to_string(p.numel) +
                            "; it must be >= 0");
    const int64_t expected = i == 0 ? p.offset : params[i - 1].offset + params[i - 1].numel;
    LOOM_CHECK(p.offset >= 0 && p.offset == expected,
          "make_buckets: parameter " + std::to_string(i) + " starts at flat offset " + std::to_string(p.offset) +
              " but must start at " + std::to_string(expected) +
              ": parameters must lie back to back in registration order");
  }

  BucketLayout layout;
  layout.shard_ranks = shard_ranks;
  layout.params = params;
  layout.bucket_of.assign(params.size(), -1);

  auto close = [&](Bucket& b) {
    const int64_t r = shard_ranks;
    b.padded_numel = (b.numel + r - 1) / r * r;
    b.shard_numel = b.padded_numel / r;
    b.shards.resize(shard_ranks);
    for (int k = 0; k < shard_ranks; ++k) {
      b.shards[k] = {b.offset + std::min(k * b.shard_numel, b.numel),
                     b.offset + std::min((k + 1) * b.shard_numel, b.numel)};
    }
    for (int p : b.params) layout.bucket_of[p] = static_cast<int>(layout.buckets.size());
    layout.buckets.push_back(std::move(b));
    b = Bucket{};
  };

  Bucket current;
  int64_t bytes = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    current.params.push_back(i);
    current.offset = params[i].offset;  // packing goes down the buffer
    current.numel += params[i].numel;
    bytes += params[i].numel * static_cast<int64_t>(sizeof(float));
    if (bytes >= bucket_bytes) {
      close(current);
      bytes = 0;
    }
  }
  if (!current.params.empty()) close(current);
  return layout;
}

std::vector<ParamSlice> param_slices(const std::vector<ParamRange>& params, FlatRange range) {
  std::vector<ParamSlice> slices;
  if (range.empty()) return slices;
  // The last parameter starting at or before range.begin (offsets ascend in registration order).
  auto it = std::upper_bound(params.begin(), params.end(), range.begin,
                             [](int64_t flat, const ParamRange& p) { return flat < p.offset; });
  size_t i = it == params.begin() ? 0 : static_cast<size_t>(it - params.begin()) - 1;
  for (; i < params.size() && params[i].offset < range.end; ++i) {
    const ParamRange& p = params[i];
    const int64_t begin = std::max(range.begin, p.offset), end = std::min(range.end, p.offset + p.numel);
    if (end > begin) slices.push_back({static_cast<int>(i), begin - p.offset, end - p.offset});
  }
  return slices;
}

double OverlapStats::hidden_fraction() const {
  if (window_s <= 0.0) return 1.0;
  return std::clamp(1.0 - blocked_s / window_s, 0.0, 1.0);
}

void OverlapStats::add(const OverlapStats& other) {
  blocked_s += other.blocked_s;
  window_s += other.window_s;
  rounds += other.rounds;
}

BucketSchedule::BucketSchedule(const BucketLayout& layout, std::string owner)
    : layout_(&layout), owner_(std::move(owner)) {
  rearm();
}

void BucketSchedule::rearm() {
  param_ready_.assign(layout_->params.size(), 0);
  pending_.resize(layout_->buckets.size());
  for (size_t b = 0; b < layout_->buckets.size(); ++b) pending_[b] = static_cast<int>(layout_->buckets[b].params.size());
  next_ = 0;
}

void BucketSchedule::mark_ready(int param, const std::function<void(int)>& launch) {
  LOOM_CHECK(param >= 0 && param < static_cast<int>(param_ready_.size()),
        owner_ + ": mark_ready(" + std::to_string(param) + "): no such parameter (valid: 0.." +
            std::to_string(static_cast<int64_t>(param_ready_.size()) - 1) + ")");
  LOOM_CHECK(!param_ready_[param], owner_ + ": mark_ready(" + std::to_string(param) +
                                  ") called twice in one round; mark each parameter once, after the last "
                                  "micro-batch's backward has written its gradient");
  param_ready_[param] = 1;
  --pending_[layout_->bucket_of[param]];
  const int buckets = static_cast<int>(pending_.size());
  while (next_ < buckets && pending_[next_] == 0) launch(next_++);
}

void BucketSchedule::launch_rest(const std::function<void(int)>& launch) {
  const int buckets = static_cast<int>(pending_.size());
  while (next_ < buckets) launch(next_++);
}

void check_gradient_op(comm::ReduceOp op, const std::string& who) {
  LOOM_CHECK(op == comm::ReduceOp::Sum || op == comm::ReduceOp::Avg,
        who + ": gradients are combined with sum or avg, not " + comm::reduce_op_name(op));
}

void check_gradient_wire(DType wire, const std::string& who) {
  LOOM_CHECK(wire == DType::F32 || wire == DType::BF16,
        who + ": gradients are reduced in f32 or bf16 (precision.grad_reduce=fp32 or bf16), not " + dtype_name(wire));
}

GradReducer::GradReducer(comm::Communicator& dp, float* grads, BucketLayout layout, comm::ReduceOp op, DType wire,
                         SiteReduction* site, Device device)
    : dp_(dp), grads_(grads), layout_(std::move(layout)), op_(op), schedule_(layout_, "GradReducer"), wire_(wire),
      device_(device), site_(site) {
  check_gradient_op(op, "GradReducer");
  LOOM_CHECK(grads_ != nullptr || layout_.numel() == 0, "GradReducer: the gradient buffer is null");
  check_gradient_wire(wire, "GradReducer");
  work_.resize(layout_.buckets.size());
  if (wire_ != DType::F32 && site_ == nullptr) {
    int64_t end = 0;
    for (const Bucket& b : layout_.buckets) end = std::max(end, b.offset + b.numel);
    staging_ = Tensor({end}, wire_, device_);
  }
  if (site_ != nullptr && site_->ranks_per_site() > 1) {
    LOOM_CHECK(layout_.shard_ranks == site_->ranks_per_site() && op == comm::ReduceOp::Sum,
               "GradReducer: across sites the buckets are padded for the ranks per site and summed");
    int64_t padded = 0, shards = 0;
    for (const Bucket& b : layout_.buckets) {
      site_offset_.push_back(padded);
      shard_offset_.push_back(shards);
      padded += b.padded_numel;
      shards += b.shard_numel;
    }
    // Sized in floats, on the gradients' device; a bf16 wire uses the first half of each area.
    site_padded_ = Tensor({padded}, DType::F32, device_);
    site_shards_ = Tensor({shards}, DType::F32, device_);
  }
}

void GradReducer::launch_across_sites(int bucket) {
  const Bucket& b = layout_.buckets[bucket];
  CrossSiteJob job;
  job.cross = site_->cross_dtype(wire_);
  if (site_->ranks_per_site() == 1) {  // nothing to do inside the site: the bucket crosses as it is
    job.shard = grads_ + b.offset;
    job.count = b.numel;
    job.device = device_;
    work_[bucket] = site_->worker->submit(std::move(job));
    return;
  }
  const int ranks = site_->ranks_per_site(), position = site_->groups->position;
  const size_t element = dtype_size(wire_);
  std::byte* padded = site_padded_.data<std::byte>() + site_offset_[bucket] * element;
  if (wire_ == DType::F32) {
    copy_on_device(device_, reinterpret_cast<float*>(padded), grads_ + b.offset, b.numel);
  } else {
    kernels::narrow_floats(device_, padded, grads_ + b.offset, b.numel, wire_);
  }
  zero_on_device(device_, padded + b.numel * element, (b.padded_numel - b.numel) * static_cast<int64_t>(element));
  std::byte* shard = site_shards_.data<std::byte>() + shard_offset_[bucket] * element;
  job.in_site = start_gradient_reduce_scatter(*site_->groups->in_site, padded, shard, b.shard_numel, wire_, op_);
  site_->count_in_site(b.padded_numel * static_cast<int64_t>(element), ranks);
  job.shard = shard;
  job.count = b.shards[position].size();
  job.dtype = wire_;
  job.device = device_;
  job.gather = true;
  // f32 lands in the gradients; a narrow wire in its padded area, widened when waited for.
  job.gather_to = wire_ == DType::F32 ? static_cast<void*>(grads_ + b.offset) : static_cast<void*>(padded);
  for (const FlatRange& s : b.shards) job.gather_counts.push_back(s.size());
  work_[bucket] = site_->worker->submit(std::move(job));
}

const void* GradReducer::reduced_staging(int bucket) const {
  if (site_ == nullptr) return staging_.data<uint16_t>() + layout_.buckets[bucket].offset;
  return site_padded_.data<uint16_t>() + site_offset_[bucket];
}

GradReducer::~GradReducer() { wait_all(false); }

void GradReducer::launch(int bucket) {
  if (!window_open_) {  // the round's first launch opens the overlap window
    window_start_ = Clock::now();
    window_open_ = true;
  }
  const Bucket& b = layout_.buckets[bucket];
  if (b.numel == 0) return;
  if (site_ != nullptr) {
    launch_across_sites(bucket);
  } else if (wire_ == DType::F32) {
    work_[bucket] = start_gradient_all_reduce(dp_, grads_ + b.offset, b.numel, DType::F32, op_);
  } else {
    uint16_t* staged = staging_.data<uint16_t>() + b.offset;
    kernels::narrow_floats(device_, staged, grads_ + b.offset, b.numel, wire_);
    work_[bucket] = start_gradient_all_reduce(dp_, staged, b.numel, wire_, op_);
  }
}

void GradReducer::mark_ready(int param) {
  schedule_.mark_ready(param, [this](int b) { launch(b); });
}

void GradReducer::wait_all(bool rethrow) {
  for (size_t bucket = 0; bucket < work_.size(); ++bucket) {
    comm::WorkHandle& w = work_[bucket];
    if (!w) continue;
    comm::WorkHandle pending = std::move(w);
    w.reset();
    if (rethrow) {
      pending->wait();
      // Widen a narrow wire's reduced bucket back into the fp32 gradients (across sites with
      // one rank per site the worker already did).
      const bool narrow = wire_ != DType::F32 && (site_ == nullptr || site_->ranks_per_site() > 1);
      if (narrow) {
        const Bucket& b = layout_.buckets[bucket];
        kernels::widen_floats(device_, grads_ + b.offset, reduced_staging(static_cast<int>(bucket)), b.numel, wire_,
                              false);
      }
    } else {
      try {
        pending->wait();
      } catch (...) {
        // Destruction during unwinding: the original error is what matters.
      }
    }
  }
}

void GradReducer::finish() {
  const Clock::time_point t0 = Clock::now();
  if (!window_open_) window_start_ = t0;
  window_open_ = true;
  schedule_.launch_rest([this](int b) { launch(b); });
  wait_all(true);
  const Clock::time_point t1 = Clock::now();
  last_ = OverlapStats{seconds(t1 - t0), seconds(t1 - window_start_), 1};
  total_.add(last_);
  schedule_.rearm();
  window_open_ = false;
}

void GradReducer::reset() {
  wait_all(true);
  schedule_.rearm();
  window_open_ = false;
}

}  // namespace loom::parallel
