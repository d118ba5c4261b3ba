#include "loom/parallel/data/bucketed_sync.h"

#include <sstream>

#include "loom/parallel/data/communication.h"
#include "loom/parallel/data/shard_memory.h"
#include "loom/parallel/data/zero3.h"

namespace loom::parallel {

BucketedSync::BucketedSync(SyncSetup setup)
    : setup_(std::move(setup)), model_(*setup_.model), zero_(setup_.config->parallel.zero) {
  lanes_ = make_lanes(setup_, lane_of_);
}

BucketedSync::~BucketedSync() { model_.set_hooks(nullptr); }

void BucketedSync::use_compact_parameters(std::byte* store) {
  model::ParameterStore& params = model_.params();
  compact_ = std::make_unique<CompactParameters>(params.values(), params.total(), setup_.param_dtype, store,
                                                 unit_flat_ranges(model_), params.device());
  install_hooks();
}

void BucketedSync::await_parameters_in_hooks() {
  await_in_hooks_ = true;
  install_hooks();
}

void BucketedSync::install_hooks() { model_.set_hooks(reducing_ || compact_ || await_in_hooks_ ? this : nullptr); }

void BucketedSync::begin_micro_batch(bool last) {
  // Reductions start during backward: of the last micro-batch (zero 0, 1) or of each (zero 2).
  reducing_ = reduces() && (last || rounds_per_micro_batch());
  install_hooks();
  if (grads_released_) {
    // The released gradients read as zero. A GPU maps their granules again (it has no demand
    // paging). On the cpu, writing the zeros brings their pages back on write faults (2 MiB
    // each, core/release_pages.h): backward's GEMMs, which read before they add, would first map
    // the shared zero page and fault again on every first write, flushing every core's TLB each
    // time (ZeRO-2 steps of GPT-2 124M took twice as long).
    model::ParameterStore& params = model_.params();
    commit_range(params.device(), params.grads(), 0, params.total());
    params.zero_grads();
    grads_released_ = false;
  }
}

void BucketedSync::before_forward(int unit) {
  await_parameters(unit);
  if (compact_) compact_->materialize(unit);
}

void BucketedSync::after_forward(int unit) {
  if (compact_) compact_->release(unit);
}

void BucketedSync::before_backward(int unit) {
  await_parameters(unit);
  if (compact_) compact_->materialize(unit);
}

void BucketedSync::after_backward(int unit) {
  if (compact_) compact_->release(unit);
  if (!reducing_) return;
  for (int id : setup_.ready_by_unit[unit]) {
    if (id == setup_.pipeline.tied_param) continue;  // waits for the other stage's half (reduce_tied_embedding)
    mark(id);
  }
}

void BucketedSync::mark(int id) {
  const int lane = lane_of_[id];
  mark_ready(lane, id - lanes_[lane].first);
}

void BucketedSync::reduce_tied_embedding() {
  const int tied = setup_.pipeline.tied_param;
  if (tied < 0) return;
  const model::Parameter& p = model_.params().list().at(tied);
  // Blocking, at the end of a round: inside backward the first stage would wait for the last
  // stage's half while the last stage waits for gradients the first one has not yet sent.
  sum_tied_gradient(*setup_.pipeline.tied_group, model_.params().grads() + p.offset, p.numel);
  if (reduces()) mark(tied);
}

void BucketedSync::end_micro_batch(bool last) {
  reducing_ = false;
  install_hooks();
  if (last || rounds_per_micro_batch()) reduce_tied_embedding();
  finish_round(last);
}

void BucketedSync::clear_gradients() {
  model::ParameterStore& params = model_.params();
  if (rounds_per_micro_batch()) {
    release_range(params.device(), params.grads(), 0, params.total());
    grads_released_ = true;
  } else {
    params.zero_grads();
  }
}

void BucketedSync::close_step_traffic(double blocked_s) {
  if (!setup_.site) return;
  const SiteReduction& site = *setup_.site;
  const SiteTraffic now{site.in_site_bytes + site.worker->in_site_bytes(), site.worker->cross_site_bytes(), blocked_s};
  last_step_ = now - at_step_start_;
  at_step_start_ = now;
}

std::string BucketedSync::memory_header() const {
  std::ostringstream out;
  const std::string params = setup_.param_dtype == DType::F32 ? "fp32" : dtype_name(setup_.param_dtype);
  out << "memory per rank (allocated, " << params << " parameters, fp32 gradients, master weights and moments, zero "
      << zero_ << ", dp " << setup_.dp->size() << "): " << describe_memory(memory_bytes());
  return out.str();
}

std::string BucketedSync::peak_memory_report() const {
  std::ostringstream out;
  out << "measured: process RSS now " << process_rss_bytes() / (1024 * 1024) << " MiB, peak "
      << process_peak_rss_bytes() / (1024 * 1024) << " MiB (all ranks of the process); ";
  if (compact_) {
    out << "fp32 parameter values resident at most " << compact_->peak_resident() * 4 / 1024 << " KiB of "
        << model_.params().total() * 4 / 1024 << " KiB (one unit at a time)";
  } else {
    out << "parameters and gradients are fully resident at zero " << zero_;
  }
  return out.str();
}

}  // namespace loom::parallel
