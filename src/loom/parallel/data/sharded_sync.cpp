#include "loom/parallel/data/sharded_sync.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/data/global_norm.h"

namespace loom::parallel {

ShardedSync::ShardedSync(SyncSetup setup) : BucketedSync(std::move(setup)) {
  model::ParameterStore& params = model_.params();
  const bool compact = setup_.param_dtype != DType::F32;
  LOOM_CHECK(!compact || lanes_.size() == 1,
             "precision.param_dtype=compute at parallel.zero " + std::to_string(zero_) +
                 " needs every parameter in one contiguous parameter group");
  const int64_t bucket_bytes = static_cast<int64_t>(setup_.config->parallel.bucket_mb * 1024.0 * 1024.0);
  for (const Lane& lane : lanes_) {
    // Across sites the optimizer is sharded over the ranks of this site and replicated across sites.
    comm::Communicator& shard_group = setup_.site ? *setup_.site->groups->in_site : *lane.comm;
    DistributedOptimizerOptions options;
    options.site = setup_.site.get();
    options.zero = zero_;
    options.wire = setup_.wire(*lane.comm);
    options.param_gather = setup_.param_dtype;
    options.keep_gathered = compact;
    options.overlap_param_gather = setup_.config->parallel.overlap_param_gather;
    options.norm_groups = setup_.model_groups;
    options.norm_excluded = setup_.norm_excluded;
    options.device = params.device();
    sharded_.push_back(std::make_unique<DistributedOptimizer>(
        shard_group, make_buckets(lane.params, bucket_bytes, shard_group.size()), optimizer_segments(params),
        setup_.config->optim, params.values(), params.grads(), options));
  }
  if (compact) use_compact_parameters(sharded_.front()->gathered_parameters());
  if (setup_.config->parallel.overlap_param_gather) {
    unit_ranges_ = unit_flat_ranges(model_);
    await_parameters_in_hooks();
  }
}

void ShardedSync::await_parameters(int unit) {
  if (unit_ranges_.empty()) return;
  for (const FlatRange& range : unit_ranges_.at(static_cast<size_t>(unit))) {
    for (auto& s : sharded_) s->wait_for_parameters(range);
  }
}

void ShardedSync::gather_full_parameters() {
  for (auto& s : sharded_) s->wait_for_parameters();
}

void ShardedSync::close_step_parameter_wait() {
  double waited = 0.0;
  for (const auto& s : sharded_) waited += s->parameter_gather_wait_s();
  last_step_wait_s_ = waited - wait_at_last_close_s_;
  wait_at_last_close_s_ = waited;
}

void ShardedSync::finish_round(bool last) {
  if (rounds_per_micro_batch()) {
    // The shards now hold this micro-batch's reduced gradient; the full buffer is free again:
    // its pages go back to the system (and read as zero) until the next backward writes them.
    for (auto& s : sharded_) s->finish_grads();
    clear_gradients();
  } else if (last) {
    for (auto& s : sharded_) s->finish_grads();
  }
}

double ShardedSync::gradient_norm() {
  std::vector<NormShare> shares;
  for (size_t i = 0; i < sharded_.size(); ++i) {
    shares.push_back(sharded_[i]->norm_share());
    shares.back().partitioned_over = setup_.groups[lanes_[i].group].partitioned_over;
    shares.back().counted = setup_.groups[lanes_[i].group].norm_counted_here;
  }
  return global_norm(shares, setup_.norm_excluded, setup_.model_groups);
}

void ShardedSync::update(double lr, int64_t step, double norm) {
  const optim::StepParams at{lr, step, optim::clip_factor(setup_.config->optim, norm)};
  gather_full_parameters();  // gathers of parameters no unit's forward awaited
  for (auto& s : sharded_) s->update(at);
  close_step_parameter_wait();
  clear_gradients();
  close_step_traffic(blocked_seconds());
}

std::vector<std::span<float>> ShardedSync::reduced_gradients() {
  std::vector<std::span<float>> out;
  for (auto& sharded : sharded_) {
    for (const OwnedShard& s : sharded->shards()) out.emplace_back(s.grad, static_cast<size_t>(s.end - s.begin));
  }
  return out;
}

void ShardedSync::skip_step() {
  for (auto& s : sharded_) s->skip_step();
  close_step_parameter_wait();
  clear_gradients();
  close_step_traffic(blocked_seconds());
}

std::vector<OwnedRange> ShardedSync::checkpoint_ranges() const {
  std::vector<OwnedRange> out;
  for (const auto& sharded : sharded_) {
    for (const OwnedShard& s : sharded->shards()) {
      if (!setup_.site) {
        out.push_back({s.begin, s.end, s.master, s.exp_avg, s.exp_avg_sq, s.moments_on_host});
        continue;
      }
      // Every site holds the same shards: site k writes the k-th part of each, so the ranks of
      // the data-parallel group still write disjoint ranges that cover the buffer.
      const SiteGroups& g = *setup_.site->groups;
      const int64_t n = s.end - s.begin;
      const int64_t first = model::balanced_first(n, g.sites, g.site), last = model::balanced_first(n, g.sites, g.site + 1);
      if (last > first) {
        out.push_back({s.begin + first, s.begin + last, s.master + first, s.exp_avg + first, s.exp_avg_sq + first,
                       s.moments_on_host});
      }
    }
  }
  return out;
}

void ShardedSync::load_moments(const float* exp_avg, const float* exp_avg_sq) {
  for (auto& s : sharded_) s->load_master_from_params();
  if (compact_) compact_->store_from_values();
  for (auto& sharded : sharded_) {
    for (const OwnedShard& s : sharded->shards()) {
      copy_from_host(s.moments_device, s.exp_avg, exp_avg + s.begin, s.end - s.begin);
      copy_from_host(s.moments_device, s.exp_avg_sq, exp_avg_sq + s.begin, s.end - s.begin);
    }
  }
}

void ShardedSync::parameters_changed() {
  for (auto& s : sharded_) s->load_master_from_params();
}

double ShardedSync::blocked_seconds() const {
  double blocked = 0.0;
  for (const auto& s : sharded_) blocked += s->total_stats().blocked_s;
  return blocked;
}

double ShardedSync::hidden_fraction() const {
  OverlapStats total;
  for (const auto& s : sharded_) total.add(s->total_stats());
  return total.hidden_fraction();
}

MemoryBytes ShardedSync::memory_bytes() const {
  const int64_t total = model_.params().total();
  MemoryBytes bytes{};
  // Compact parameters: 2 bytes each, the fp32 values resident only for the unit in flight.
  bytes.parameters = compact_ ? total * static_cast<int64_t>(dtype_size(setup_.param_dtype)) : total * 4;
  // ZeRO-2 keeps only the reduced shards between backward passes (the full buffer's pages are
  // released after each round); ZeRO-1 keeps the full buffer.
  const bool released = rounds_per_micro_batch();
  bytes.gradients = released ? 0 : total * 4;
  for (const auto& s : sharded_) {
    const ShardAllocation a = s->allocation();
    bytes.master_weights += a.master * 4;
    bytes.optimizer_moments += a.moments * 4;
    bytes.host_optimizer_moments += a.host_moments * 4;
    bytes.gradients += a.grad_shards * 4;
    bytes.communication_buffers += a.comm_buffers * 4;
    if (compact_) bytes.communication_buffers += a.master * static_cast<int64_t>(dtype_size(setup_.param_dtype));
  }
  return bytes;
}

std::string ShardedSync::memory_report() const {
  std::string out = memory_header();
  if (compact_) out += "; plus the fp32 values of the unit in flight";
  if (rounds_per_micro_batch()) out += "; plus the fp32 gradient buffer during each backward";
  return out;
}

}  // namespace loom::parallel
