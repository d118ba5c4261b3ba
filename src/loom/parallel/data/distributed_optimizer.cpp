#include "loom/parallel/data/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/parallel/data/communication.h"
#include "loom/parallel/data/global_norm.h"
#include "loom/parallel/data/shard_memory.h"
#include "loom/parallel/data/sync_setup.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

DistributedOptimizer::DistributedOptimizer(comm::Communicator& dp, BucketLayout layout,
                                           std::vector<optim::Segment> segments, const config::OptimConfig& config,
                                           float* params, float* grads, DistributedOptimizerOptions options)
    : dp_(dp),
      layout_(std::move(layout)),
      segments_(std::move(segments)),
      config_(config),
      optimizer_(optim::make_optimizer(config, options.device)),
      params_(params),
      grads_(grads),
      options_(std::move(options)),
      rank_(dp.rank()),
      schedule_(layout_, "DistributedOptimizer") {
  const std::string who = "DistributedOptimizer (group '" + dp.name() + "')";
  LOOM_CHECK(options_.zero == 1 || options_.zero == 2,
        who + ": parallel.zero=" + std::to_string(options_.zero) +
            " is not a stage of the distributed optimizer (valid: 1, 2; 0 is plain DDP with GradReducer, 3 shards "
            "the parameters themselves)");
  check_gradient_op(options_.reduce_op, who);
  check_gradient_wire(options_.wire, who);
  LOOM_CHECK(options_.comm_buffers >= 1,
        who + ": comm_buffers must be >= 1 (got " + std::to_string(options_.comm_buffers) + ")");
  LOOM_CHECK(layout_.shard_ranks == dp.size(), who + ": the bucket layout is sharded for " +
                                              std::to_string(layout_.shard_ranks) + " ranks but the group has " +
                                              std::to_string(dp.size()) + "; make it with shard_ranks = dp size");
  LOOM_CHECK((params_ != nullptr && grads_ != nullptr) || layout_.numel() == 0,
        who + ": the parameter and gradient buffers must not be null");
  for (comm::Communicator* g : options_.norm_groups) LOOM_CHECK(g != nullptr, who + ": a norm group is null");

  const size_t buckets = layout_.buckets.size();
  state_offset_.resize(buckets);
  grad_offset_.resize(buckets);
  pieces_.resize(buckets);
  gather_counts_.resize(buckets);
  in_flight_.resize(buckets);
  int64_t state = 0, grad = 0, max_shard = 0, communicating = 0;
  for (size_t b = 0; b < buckets; ++b) {
    const Bucket& bucket = layout_.buckets[b];
    const FlatRange mine = bucket.shards[rank_];
    state_offset_[b] = state;
    grad_offset_[b] = grad;
    state += mine.size();
    grad += bucket.shard_numel;
    max_shard = std::max(max_shard, bucket.shard_numel);
    if (bucket.numel > 0) ++communicating;
    for (const FlatRange& s : bucket.shards) gather_counts_[b].push_back(s.size());
    for (const optim::Segment& seg : segments_) {
      const int64_t begin = std::max(mine.begin, seg.offset), end = std::min(mine.end, seg.offset + seg.numel);
      if (end > begin) pieces_[b].push_back({begin - mine.begin, end - begin, seg.weight_decay, seg.lr_scale});
    }
    std::sort(pieces_[b].begin(), pieces_[b].end(), [](const Piece& x, const Piece& y) { return x.local < y.local; });
  }
  // Only the owned shards get optimizer state: ~numel / dp elements each (the moments, or their
  // optim.offload_fraction, on the host where the optimizer is offloaded; the master weights stay
  // on the device, the gathers' source).
  const Device device = options_.device;
  master_ = Tensor({state}, DType::F32, device);
  moments_ = optim::MomentArrays(state, optim::offloaded_elements(config, !device.is_cpu(), state), device);
  // ZeRO-1 reduces once per step and keeps the full gradient buffer through it: the reduced shard
  // is written back in place into the buffer (Megatron's layout: 6 + 12/d bytes per parameter with
  // bf16 parameters). ZeRO-2 frees the buffer between rounds, so its shards are a buffer of their own.
  in_place_ = options_.zero == 1;
  grad_shards_ = Tensor({in_place_ ? 0 : grad}, DType::F32, device);
  const int slots = static_cast<int>(std::min<int64_t>(options_.comm_buffers, communicating));
  slot_elements_ = (dp.size() + 1) * max_shard;  // the padded bucket, then a receive area
  staging_ = Tensor({slots * slot_elements_}, options_.wire, device);
  slot_bucket_.assign(slots, -1);
  prepare_parameter_gathers(who, state);
  load_master_from_params();
}

void DistributedOptimizer::prepare_parameter_gathers(const std::string& who, int64_t owned) {
  LOOM_CHECK(options_.param_gather == DType::F32 || options_.param_gather == DType::BF16 ||
            options_.param_gather == DType::F16,
        who + ": parameters are all-gathered in f32, bf16 or f16 (precision.param_dtype=fp32 or compute)");
  if (options_.param_gather != DType::F32) {
    gathered_ = Tensor({layout_.numel()}, options_.param_gather, options_.device);
    gather_send_ = Tensor({owned}, options_.param_gather, options_.device);
  }
  parameter_gathers_.resize(layout_.buckets.size());
  // Gathers left in flight on the data-parallel group itself would hold back every collective
  // issued after them there (a group runs its operations in issue order), the next step's first
  // ones included.
  if (options_.overlap_param_gather && dp_.size() > 1) {
    gather_group_ = split_group(dp_, 0, dp_.rank(), dp_.name() + "-param-gather");
  }
}

DistributedOptimizer::~DistributedOptimizer() { wait_all_quietly(); }

void DistributedOptimizer::load_master_from_params() {
  wait_for_parameters();
  float* master = master_.data<float>();
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const FlatRange mine = layout_.buckets[b].shards[rank_];
    copy_on_device(options_.device, master + state_offset_[b], params_ + mine.begin, mine.size());
  }
  // The parameters as a gather would leave them: rounded to its dtype (every rank alike).
  if (options_.param_gather != DType::F32) {
    std::byte* rounded = gathered_.data<std::byte>();
    kernels::narrow_floats(options_.device, rounded, params_, layout_.numel(), options_.param_gather);
    if (!options_.keep_gathered)
      kernels::widen_floats(options_.device, params_, rounded, layout_.numel(), options_.param_gather, false);
  }
}

void DistributedOptimizer::launch(int bucket) {
  const Bucket& b = layout_.buckets[bucket];
  if (b.numel == 0) return;  // nothing to reduce; every rank skips it alike
  if (!window_open_) {
    window_start_ = Clock::now();
    window_open_ = true;
  }
  const int slot = bucket % static_cast<int>(slot_bucket_.size());
  if (slot_bucket_[slot] >= 0) {  // the slot's previous bucket must be done before it is overwritten
    const Clock::time_point t0 = Clock::now();
    complete(slot_bucket_[slot]);
    blocked_s_ += seconds(Clock::now() - t0);
  }
  const DType wire = options_.wire;
  const size_t element = dtype_size(wire);
  std::byte* send = staging_.data<std::byte>() + slot * slot_elements_ * element;
  stage_for_reduce(options_.device, send, grads_ + b.offset, b.numel, b.padded_numel, wire);
  // The first f32 round of a step receives straight into the shard; later ones (ZeRO-2 rounds
  // per micro-batch) and narrow wires receive beside the send area, then are added or widened.
  const bool accumulate = rounds_ > 0;
  LOOM_CHECK(!accumulate || !in_place_, "DistributedOptimizer: ZeRO-1 reduces once per step (finish_grads() once before "
                                   "step()); several rounds are ZeRO-2's");
  // In place, the received shard's padding must not land in the gradient buffer: staged too.
  const bool staged = accumulate || wire != DType::F32 || in_place_;
  void* recv = staged ? static_cast<void*>(send + b.padded_numel * element) : static_cast<void*>(reduced_shard(bucket));
  comm::WorkHandle work = start_gradient_reduce_scatter(dp_, send, recv, b.shard_numel, wire, options_.reduce_op);
  if (SiteReduction* site = options_.site; site != nullptr) {
    site->count_in_site(b.padded_numel * static_cast<int64_t>(element), dp_.size());
    CrossSiteJob job;
    job.in_site = std::move(work);
    job.shard = recv;
    job.count = b.shards[rank_].size();  // the padding never crosses
    job.dtype = wire;
    job.cross = site->cross_dtype(wire);
    job.device = options_.device;
    work = site->worker->submit(std::move(job));
  }
  in_flight_[bucket] = {std::move(work), staged, accumulate};
  slot_bucket_[slot] = bucket;
}

void DistributedOptimizer::complete(int bucket) {
  InFlight& f = in_flight_[bucket];
  const int slot = bucket % static_cast<int>(slot_bucket_.size());
  slot_bucket_[slot] = -1;
  comm::WorkHandle work = std::move(f.work);
  f.work.reset();
  work->wait();
  if (!f.staged) return;
  const Bucket& b = layout_.buckets[bucket];
  const size_t element = dtype_size(options_.wire);
  const std::byte* received = staging_.data<std::byte>() + (slot * slot_elements_ + b.padded_numel) * element;
  float* shard = reduced_shard(bucket);
  const int64_t count = in_place_ ? b.shards[rank_].size() : b.shard_numel;
  take_reduced(options_.device, shard, received, count, options_.wire, f.accumulate);
}

float* DistributedOptimizer::reduced_shard(int bucket) {
  if (in_place_) return grads_ + layout_.buckets[bucket].shards[rank_].begin;
  return grad_shards_.data<float>() + grad_offset_[bucket];
}

void DistributedOptimizer::wait_all_quietly() {
  auto wait_quietly = [](comm::WorkHandle& work) {
    if (!work) return;
    try {
      work->wait();
    } catch (...) {
      // Destruction during unwinding: the original error is what matters.
    }
    work.reset();
  };
  for (InFlight& f : in_flight_) wait_quietly(f.work);
  for (comm::WorkHandle& work : parameter_gathers_) wait_quietly(work);
  std::fill(slot_bucket_.begin(), slot_bucket_.end(), -1);
}

void DistributedOptimizer::mark_ready(int param) {
  LOOM_CHECK(options_.zero == 2 || rounds_ == 0,
        "DistributedOptimizer: ZeRO-1 reduces gradients once per step (after the last micro-batch); call step() "
        "before marking gradients again, or use parallel.zero=2 to reduce every micro-batch");
  schedule_.mark_ready(param, [this](int b) { launch(b); });
}

void DistributedOptimizer::finish_grads() {
  LOOM_CHECK(options_.zero == 2 || rounds_ == 0,
        "DistributedOptimizer: ZeRO-1 reduces gradients once per step; finish_grads() was already called since the "
        "last step()");
  const Clock::time_point t0 = Clock::now();
  if (!window_open_) window_start_ = t0;
  schedule_.launch_rest([this](int b) { launch(b); });
  for (size_t b = 0; b < in_flight_.size(); ++b) {
    if (in_flight_[b].work) complete(static_cast<int>(b));
  }
  const Clock::time_point t1 = Clock::now();
  last_ = OverlapStats{blocked_s_ + seconds(t1 - t0), seconds(t1 - window_start_), 1};
  total_.add(last_);
  blocked_s_ = 0.0;
  window_open_ = false;
  schedule_.rearm();
  ++rounds_;
}

void DistributedOptimizer::check_reduced() const {
  LOOM_CHECK(rounds_ > 0, "DistributedOptimizer: step() needs the gradients reduced first: mark_ready each parameter "
                     "(or not) and call finish_grads() before step()");
}

NormShare DistributedOptimizer::norm_share() {
  check_reduced();
  NormShare share{{}, &dp_, nullptr, options_.device};
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    share.pieces.push_back({reduced_shard(static_cast<int>(b)), layout_.buckets[b].shards[rank_]});
  }
  return share;
}

comm::WorkHandle DistributedOptimizer::gather_parameters(int bucket) {
  const Bucket& b = layout_.buckets[bucket];
  if (options_.site != nullptr) options_.site->count_in_site(b.numel * static_cast<int64_t>(dtype_size(options_.param_gather)), dp_.size());
  comm::Communicator& group = gather_group_ ? *gather_group_ : dp_;
  if (options_.param_gather == DType::F32) {
    return start_shard_all_gather(group, master_.data<float>() + state_offset_[bucket], params_ + b.offset,
                                  gather_counts_[bucket], DType::F32);
  }
  // The owned shard travels rounded to the compute dtype.
  const size_t element = dtype_size(options_.param_gather);
  std::byte* send = gather_send_.data<std::byte>() + state_offset_[bucket] * element;
  kernels::narrow_floats(options_.device, send, master_.data<float>() + state_offset_[bucket], b.shards[rank_].size(),
                         options_.param_gather);
  return start_shard_all_gather(group, send, gathered_.data<std::byte>() + b.offset * element, gather_counts_[bucket],
                                options_.param_gather);
}

void DistributedOptimizer::finish_parameter_gather(int bucket, comm::WorkHandle& work) {
  const Clock::time_point t0 = Clock::now();
  comm::WorkHandle done = std::move(work);
  work.reset();
  // Overlapped, what reads the parameters next is the unit's forward on the compute stream: on
  // nccl that stream waits for the gather, not the host, which goes on queueing the forward.
  if (options_.overlap_param_gather) {
    done->wait_in_stream();
  } else {
    done->wait();
  }
  gather_wait_s_ += seconds(Clock::now() - t0);
  if (options_.param_gather == DType::F32 || options_.keep_gathered) return;
  const Bucket& b = layout_.buckets[bucket];
  const size_t element = dtype_size(options_.param_gather);
  kernels::widen_floats(options_.device, params_ + b.offset, gathered_.data<std::byte>() + b.offset * element, b.numel,
                        options_.param_gather, false);
}

void DistributedOptimizer::wait_for_parameters(FlatRange range) {
  // Forward order (the last bucket holds the first parameters), the order they were issued in.
  for (int b = static_cast<int>(layout_.buckets.size()) - 1; b >= 0; --b) {
    const Bucket& bucket = layout_.buckets[b];
    const bool overlaps = bucket.offset < range.end && range.begin < bucket.offset + bucket.numel;
    if (parameter_gathers_[b] && overlaps) finish_parameter_gather(b, parameter_gathers_[b]);
  }
}

int DistributedOptimizer::parameter_gathers_in_flight() const {
  return static_cast<int>(std::count_if(parameter_gathers_.begin(), parameter_gathers_.end(),
                                        [](const comm::WorkHandle& w) { return w != nullptr; }));
}

double DistributedOptimizer::step(double lr, int64_t step) {
  const double norm = global_norm({norm_share()}, options_.norm_excluded, options_.norm_groups);
  update(optim::StepParams{lr, step, optim::clip_factor(config_, norm)});
  return norm;
}

void DistributedOptimizer::update(const optim::StepParams& at) {
  check_reduced();
  LOOM_CHECK(parameter_gathers_in_flight() == 0,
             "DistributedOptimizer: the last update's parameter gathers are still in flight; the forward in "
             "between waits for them (wait_for_parameters)");
  float* master = master_.data<float>();
  std::vector<optim::ShardPiece> pieces;
  const int buckets = static_cast<int>(layout_.buckets.size());
  for (int i = 0; i < buckets; ++i) {
    // Left in flight, the gathers go in forward order, so that the first units' arrive first.
    const int b = options_.overlap_param_gather ? buckets - 1 - i : i;
    const float* grad = reduced_shard(b);
    pieces.clear();
    for (const Piece& p : pieces_[b]) {
      for (const optim::MomentArrays::Part& part : moments_.parts(state_offset_[b] + p.local, p.numel)) {
        const int64_t local = part.begin - state_offset_[b];
        pieces.push_back({master + part.begin, grad + local, {part.exp_avg, part.exp_avg_sq}, part.n, p.weight_decay,
                          p.lr_scale});
        pieces.back().state_on_host = part.on_host;
      }
    }
    optimizer_->update_many(pieces, at);  // the bucket's pieces in as few launches as they allow
    // Each bucket's gather starts as soon as it is updated, overlapping the next bucket's update.
    if (layout_.buckets[b].numel > 0) parameter_gathers_[b] = gather_parameters(b);
  }
  if (!options_.overlap_param_gather) {
    for (int b = 0; b < buckets; ++b) {
      if (parameter_gathers_[b]) finish_parameter_gather(b, parameter_gathers_[b]);
    }
  }
  rounds_ = 0;  // the next round's reduce-scatters overwrite the shards' gradients
}

std::vector<OwnedShard> DistributedOptimizer::shards() {
  std::vector<OwnedShard> out;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const FlatRange mine = layout_.buckets[b].shards[rank_];
    if (mine.empty()) continue;
    const int64_t s = state_offset_[b];
    float* grad = reduced_shard(static_cast<int>(b));
    for (const optim::MomentArrays::Part& part : moments_.parts(s, mine.size())) {
      const int64_t local = part.begin - s;
      out.push_back({static_cast<int>(b), mine.begin + local, mine.begin + local + part.n,
                     master_.data<float>() + part.begin, part.exp_avg, part.exp_avg_sq, grad + local, part.on_host,
                     part.device});
    }
  }
  return out;
}

ShardAllocation DistributedOptimizer::allocation() const {
  return {master_.numel(), 2 * moments_.device_elements(), 2 * moments_.host_elements(), grad_shards_.numel(),
          static_cast<int64_t>(staging_.nbytes() / sizeof(float))};
}

}  // namespace loom::parallel
