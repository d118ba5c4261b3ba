#include "loom/parallel/data/data_parallel_step.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "loom/comm/reduce.h"
#include "loom/core/error.h"
#include "loom/parallel/data/global_norm.h"
#include "loom/parallel/data/memory_accounting.h"
#include "loom/parallel/data/release_pages.h"

namespace loom::parallel {

namespace {
std::vector<parallel::ParamRange> param_ranges(const model::ParameterStore& params) {
  std::vector<parallel::ParamRange> ranges;
  for (const model::Parameter& p : params.list()) ranges.push_back({p.offset, p.numel});
  return ranges;
}

// Parameters this rank leaves out of the gradient norm (another tensor-parallel rank counts
// them), as merged flat ranges in order.
std::vector<parallel::FlatRange> norm_excluded(const model::ParameterStore& params) {
  std::vector<parallel::FlatRange> out;
  for (const model::Parameter& p : params.list()) {
    if (p.shard.counts_in_norm) continue;
    if (!out.empty() && out.back().end == p.offset) {
      out.back().end += p.numel;
    } else {
      out.push_back({p.offset, p.offset + p.numel});
    }
  }
  return out;
}
}  // namespace

DataParallelStep::DataParallelStep(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                                   comm::Communicator* pp)
    : dp_(dp), model_(model), zero_(config.parallel.zero) {
  LOOM_CHECK(zero_ >= 0 && zero_ <= 3, "parallel.zero " + std::to_string(zero_) + " is not supported by this trainer (valid: 0, 1, 2, 3)");
  model::ParameterStore& params = model.params();
  const std::vector<int> ready = model.gradient_ready_unit();
  ready_by_unit_.resize(model.units());
  for (size_t id = 0; id < ready.size(); ++id) ready_by_unit_[ready[id]].push_back(static_cast<int>(id));
  if (comm::Communicator* tp = model.tensor_parallel().group(); tp != nullptr && tp->size() > 1) {
    norm_groups_.push_back(tp);
  }
  if (pp != nullptr && pp->size() > 1) {
    LOOM_CHECK(zero_ != 3, "parallel.zero=3 shards every parameter over the data-parallel ranks around each unit; with "
                      "pipeline parallelism (parallel.pp > 1) use parallel.zero 0, 1 or 2");
    norm_groups_.push_back(pp);
  }
  norm_excluded_ = norm_excluded(params);

  // precision.grad_reduce=bf16: gradients travel and are summed as bf16 (f32 accumulation) at
  // every stage: DDP's all-reduce, ZeRO 1-2's bucket and ZeRO 3's unit reduce-scatters. One rank
  // sends nothing, so nothing is rounded (as zero 0, which then builds no reducer).
  const DType wire = config.precision.grad_reduce == "bf16" && dp.size() > 1 ? DType::BF16 : DType::F32;
  // precision.param_dtype=compute: the fp32 master weights live in the optimizer and the model's
  // parameters are them rounded to the compute dtype (what Megatron's bf16 models hold).
  param_dtype_ = DType::F32;
  if (config.precision.param_dtype == "compute" && config.precision.recipe != "fp32") {
    param_dtype_ = config.precision.recipe == "fp16" ? DType::F16 : DType::BF16;
  }
  if (zero_ == 3) {
    std::vector<std::vector<int>> units;
    for (int u = 0; u < model.units(); ++u) units.push_back(model.unit_parameters(u));
    parallel::Zero3Options options;
    options.wire = wire;
    options.param_gather = param_dtype_;
    options.norm_groups = norm_groups_;
    options.norm_excluded = norm_excluded_;
    zero3_ = std::make_unique<parallel::Zero3>(dp, params.values(), params.grads(), param_ranges(params), units,
                                               optimizer_segments(params), config.optim, options);
    // Installed for good: a forward outside a micro-batch (evaluation) without the full
    // parameters gathered is then an Error rather than a pass over released (zero) weights.
    model.set_hooks(zero3_.get());
    return;
  }
  const int64_t bucket_bytes = static_cast<int64_t>(config.parallel.bucket_mb * 1024.0 * 1024.0);
  parallel::BucketLayout layout = parallel::make_buckets(param_ranges(params), bucket_bytes, dp.size());
  if (zero_ == 0) {
    adamw_ = std::make_unique<optim::AdamW>(config.optim, params.total(), optimizer_segments(params));
    if (param_dtype_ != DType::F32) {
      master_.assign(params.values(), params.values() + params.total());
      compact_store_.resize(static_cast<size_t>(params.total()) * dtype_size(param_dtype_));
    }
    if (dp.size() > 1) {
      reducer_ = std::make_unique<parallel::GradReducer>(dp, params.grads(), std::move(layout), comm::ReduceOp::Sum, wire);
    }
  } else {
    parallel::DistributedOptimizerOptions options;
    options.zero = zero_;
    options.wire = wire;
    options.param_gather = param_dtype_;
    options.keep_gathered = param_dtype_ != DType::F32;
    options.norm_groups = norm_groups_;
    options.norm_excluded = norm_excluded_;
    sharded_ = std::make_unique<parallel::DistributedOptimizer>(dp, std::move(layout), optimizer_segments(params),
                                                                config.optim, params.values(), params.grads(), options);
  }
  if (param_dtype_ != DType::F32) {
    // The units' flat ranges (adjacent parameters merged), for widening unit by unit.
    std::vector<std::vector<parallel::FlatRange>> units;
    for (int u = 0; u < model.units(); ++u) {
      std::vector<parallel::FlatRange> ranges;
      for (int id : model.unit_parameters(u)) {
        const model::Parameter& p = params.list()[id];
        if (!ranges.empty() && ranges.back().end == p.offset) {
          ranges.back().end += p.numel;
        } else {
          ranges.push_back({p.offset, p.offset + p.numel});
        }
      }
      units.push_back(std::move(ranges));
    }
    std::byte* store = sharded_ ? sharded_->gathered_parameters() : compact_store_.data();
    compact_ = std::make_unique<parallel::CompactParameters>(params.values(), params.total(), param_dtype_, store,
                                                             std::move(units));
    install_hooks();
  }
}

DataParallelStep::~DataParallelStep() { model_.set_hooks(nullptr); }

void DataParallelStep::set_tied_embedding(comm::Communicator* embedding, int param) {
  LOOM_CHECK(zero_ != 3, "tied embeddings across pipeline stages need parallel.zero 0, 1 or 2");
  tied_group_ = embedding;
  tied_param_ = param;
}

void DataParallelStep::begin_micro_batch(bool last) {
  if (zero3_) {  // every micro-batch gathers and reduces unit by unit
    zero3_->begin_micro_batch();
    return;
  }
  // Reductions start during backward: of the last micro-batch (zero 0, 1) or of each (zero 2).
  reducing_ = (reducer_ || sharded_) && (last || rounds_per_micro_batch());
  install_hooks();
}

void DataParallelStep::install_hooks() { model_.set_hooks(reducing_ || compact_ ? this : nullptr); }

void DataParallelStep::before_forward(int unit) {
  if (compact_) compact_->materialize(unit);
}

void DataParallelStep::after_forward(int unit) {
  if (compact_) compact_->release(unit);
}

void DataParallelStep::before_backward(int unit) {
  if (compact_) compact_->materialize(unit);
}

void DataParallelStep::after_backward(int unit) {
  if (compact_) compact_->release(unit);
  if (!reducing_) return;
  for (int id : ready_by_unit_[unit]) {
    if (id == tied_param_) continue;  // waits for the other stage's half (reduce_tied_embedding)
    if (reducer_) reducer_->mark_ready(id);
    if (sharded_) sharded_->mark_ready(id);
  }
}

void DataParallelStep::reduce_tied_embedding() {
  if (tied_param_ < 0) return;
  const model::Parameter& p = model_.params().list().at(tied_param_);
  // Blocking, at the end of a round: inside backward the first stage would wait for the last
  // stage's half while the last stage waits for gradients the first one has not yet sent.
  tied_group_->all_reduce(model_.params().grads() + p.offset, p.numel, DType::F32, comm::ReduceOp::Sum);
  if (reducer_) reducer_->mark_ready(tied_param_);
  if (sharded_) sharded_->mark_ready(tied_param_);
}

void DataParallelStep::end_micro_batch(bool last) {
  if (zero3_) {
    zero3_->end_micro_batch();
    return;
  }
  reducing_ = false;
  install_hooks();
  if (last || rounds_per_micro_batch()) reduce_tied_embedding();
  if (rounds_per_micro_batch()) {
    // The shards now hold this micro-batch's reduced gradient; the full buffer is free again:
    // its pages go back to the system (and read as zero) until the next backward writes them.
    sharded_->finish_grads();
    clear_gradients();
  } else if (last && reducer_) {
    reducer_->finish();
  } else if (last && sharded_) {
    sharded_->finish_grads();
  }
}

double DataParallelStep::step(double lr, int64_t step) {
  if (zero3_) return zero3_->step(lr, step);  // the gradient buffer was released unit by unit
  model::ParameterStore& params = model_.params();
  double norm = 0.0;
  if (sharded_) {
    norm = sharded_->step(lr, step);
  } else {
    // Gradients are whole on every data-parallel rank: the norm sums this rank's shard of the
    // model over the tensor-parallel group, each replicated copy counted once.
    const double local = parallel::sum_of_squares_excluding(params.grads(), {0, params.total()}, norm_excluded_);
    norm = std::sqrt(norm_groups_.empty()
                         ? local
                         : parallel::sum_over_groups(local, *norm_groups_[0], {norm_groups_.begin() + 1, norm_groups_.end()}));
    if (master_.empty()) {
      adamw_->step_with_norm(params.values(), params.grads(), lr, step, norm);
    } else {
      adamw_->step_with_norm(master_.data(), params.grads(), lr, step, norm);
      comm::from_f32(compact_store_.data(), master_.data(), params.total(), param_dtype_);
    }
  }
  clear_gradients();
  return norm;
}

void DataParallelStep::clear_gradients() {
  model::ParameterStore& params = model_.params();
  if (rounds_per_micro_batch()) {
    parallel::release_pages(params.grads(), 0, params.total());
  } else {
    params.zero_grads();
  }
}

std::vector<std::span<float>> DataParallelStep::reduced_gradients() {
  if (zero3_) return {{zero3_->reduced_gradients(), static_cast<size_t>(zero3_->reduced_gradients_numel())}};
  std::vector<std::span<float>> out;
  if (sharded_) {
    for (const parallel::OwnedShard& s : sharded_->shards()) out.emplace_back(s.grad, static_cast<size_t>(s.end - s.begin));
  } else {
    out.emplace_back(model_.params().grads(), static_cast<size_t>(model_.params().total()));
  }
  return out;
}

void DataParallelStep::skip_step() {
  if (zero3_) {
    zero3_->skip_step();
    return;
  }
  if (sharded_) sharded_->skip_step();
  clear_gradients();
}

std::vector<OwnedRange> DataParallelStep::checkpoint_ranges() const {
  const model::ParameterStore& params = model_.params();
  const int64_t total = params.total();
  if (sharded_) {
    std::vector<OwnedRange> out;
    for (const parallel::OwnedShard& s : sharded_->shards()) out.push_back({s.begin, s.end, s.master, s.exp_avg, s.exp_avg_sq});
    return out;
  }
  if (zero3_) {
    std::vector<OwnedRange> out;
    for (const parallel::Zero3::OwnedShard& s : zero3_->shards()) out.push_back({s.begin, s.end, s.value, s.exp_avg, s.exp_avg_sq});
    return out;
  }
  const float* exp_avg = adamw_->exp_avg();
  const float* exp_avg_sq = adamw_->exp_avg_sq();
  // Every rank holds everything: each writes an even part (of the master weights, when the
  // parameters are rounded copies of them).
  const int64_t begin = model::balanced_first(total, dp_.size(), dp_.rank());
  const int64_t end = model::balanced_first(total, dp_.size(), dp_.rank() + 1);
  const float* values = master_.empty() ? params.values() : master_.data();
  return {{begin, end, values + begin, exp_avg + begin, exp_avg_sq + begin}};
}

void DataParallelStep::load_moments(const float* exp_avg, const float* exp_avg_sq) {
  const int64_t total = model_.params().total();
  if (zero3_) {
    zero3_->load_from_full();
    zero3_->load_moments(exp_avg, exp_avg_sq);
    return;
  }
  if (adamw_) {
    std::copy(exp_avg, exp_avg + total, adamw_->exp_avg());
    std::copy(exp_avg_sq, exp_avg_sq + total, adamw_->exp_avg_sq());
    if (compact_) {  // the checkpoint holds the master weights, loaded into the values
      master_.assign(model_.params().values(), model_.params().values() + total);
      compact_->store_from_values();
    }
    return;
  }
  sharded_->load_master_from_params();
  if (compact_) compact_->store_from_values();
  for (const parallel::OwnedShard& s : sharded_->shards()) {
    std::copy(exp_avg + s.begin, exp_avg + s.end, s.exp_avg);
    std::copy(exp_avg_sq + s.begin, exp_avg_sq + s.end, s.exp_avg_sq);
  }
}

void DataParallelStep::gather_full_parameters() {
  if (zero3_) zero3_->gather_full_parameters();
}

void DataParallelStep::release_full_parameters() {
  if (zero3_) zero3_->release_full_parameters();
}

double DataParallelStep::hidden_fraction() const {
  if (zero3_) return zero3_->hidden_fraction();
  if (reducer_) return reducer_->total_stats().hidden_fraction();
  if (sharded_) return sharded_->total_stats().hidden_fraction();
  return 1.0;
}

parallel::MemoryBytes DataParallelStep::memory_bytes() const {
  const int64_t total = model_.params().total();
  parallel::MemoryBytes bytes{};
  if (zero3_) {
    // Persistent state only; the units gathered in flight come on top (peak_memory_report()).
    const parallel::Zero3Memory m = zero3_->memory();
    bytes.parameters = m.parameter_shard;  // fp32: the shard is its own master copy
    bytes.gradients = m.gradient_shard;
    bytes.optimizer_moments = m.moments;
    bytes.communication_buffers = m.comm_buffers;
    return bytes;
  }
  // Compact parameters: 2 bytes each, the fp32 values resident only for the unit in flight.
  bytes.parameters = compact_ ? total * static_cast<int64_t>(dtype_size(param_dtype_)) : total * 4;
  // ZeRO-2 keeps only the reduced shards between backward passes (the full buffer's pages are
  // released after each round); the others keep the full buffer.
  bytes.gradients = rounds_per_micro_batch() ? 0 : total * 4;
  if (sharded_) {
    parallel::ShardAllocation a = sharded_->allocation();
    bytes.master_weights = a.master * 4;
    bytes.optimizer_moments = a.moments * 4;
    bytes.gradients += a.grad_shards * 4;
    bytes.communication_buffers = a.comm_buffers * 4;
    if (compact_) bytes.communication_buffers += a.master * static_cast<int64_t>(dtype_size(param_dtype_));  // gather send
  } else {
    bytes.optimizer_moments = total * 8;
    bytes.master_weights = static_cast<int64_t>(master_.size()) * 4;  // param_dtype=compute
  }
  return bytes;
}

std::string DataParallelStep::memory_report() const {
  std::ostringstream out;
  const std::string params = param_dtype_ == DType::F32 ? "fp32" : dtype_name(param_dtype_);
  out << "memory per rank (allocated, " << params << " parameters, fp32 gradients, master weights and moments, zero "
      << zero_ << ", dp " << dp_.size() << "): " << parallel::describe_memory(memory_bytes());
  if (zero3_) out << "; plus the units gathered in flight";
  if (compact_) out << "; plus the fp32 values of the unit in flight";
  if (rounds_per_micro_batch()) out << "; plus the fp32 gradient buffer during each backward";
  return out.str();
}

std::string DataParallelStep::peak_memory_report() const {
  if (zero3_) return parallel::describe_zero3_peak(zero3_->memory());
  std::ostringstream out;
  out << "measured: process RSS now " << parallel::process_rss_bytes() / (1024 * 1024) << " MiB, peak "
      << parallel::process_peak_rss_bytes() / (1024 * 1024) << " MiB (all ranks of the process); ";
  if (compact_) {
    out << "fp32 parameter values resident at most " << compact_->peak_resident() * 4 / 1024 << " KiB of "
        << model_.params().total() * 4 / 1024 << " KiB (one unit at a time)";
  } else {
    out << "parameters and gradients are fully resident at zero " << zero_;
  }
  return out.str();
}

}  // namespace loom::parallel
