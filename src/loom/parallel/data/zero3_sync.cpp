#include "loom/parallel/data/zero3_sync.h"

#include <algorithm>
#include <sstream>

#include "loom/core/error.h"
#include "loom/parallel/data/global_norm.h"

namespace loom::parallel {

Zero3Sync::Zero3Sync(SyncSetup setup) : setup_(std::move(setup)) {
  model::Transformer& model = *setup_.model;
  model::ParameterStore& params = model.params();
  const std::vector<ParamRange> ranges = param_ranges(params);
  for (const ParameterGroup& group : setup_.groups) {
    // The group's parameters, and each unit's of them, renumbered within the group.
    std::vector<int> index(ranges.size(), -1);
    std::vector<ParamRange> mine;
    std::vector<int> ids = group.params;
    std::sort(ids.begin(), ids.end());
    for (int id : ids) {
      index[id] = static_cast<int>(mine.size());
      mine.push_back(ranges[id]);
    }
    std::vector<std::vector<int>> units;
    for (int u = 0; u < model.units(); ++u) {
      units.emplace_back();
      for (int id : model.unit_parameters(u)) {
        if (index[id] >= 0) units.back().push_back(index[id]);
      }
    }
    Zero3Options options;
    options.wire = setup_.wire(*group.comm);
    options.param_gather = setup_.param_dtype;
    options.norm_groups = setup_.model_groups;
    options.norm_excluded = setup_.norm_excluded;
    options.device = params.device();
    options.offload_shards = setup_.config->parallel.offload_params;
    options.device_gather_copy = setup_.config->parallel.offload_params_device_copy;
    zero3_.push_back(std::make_unique<Zero3>(*group.comm, params.values(), params.grads(), std::move(mine), units,
                                             optimizer_segments(params), setup_.config->optim, options));
  }
  model.set_hooks(this);
}

Zero3Sync::~Zero3Sync() { setup_.model->set_hooks(nullptr); }

void Zero3Sync::begin_micro_batch(bool) {
  for (auto& z : zero3_) z->begin_micro_batch();
}
void Zero3Sync::end_micro_batch(bool) {
  for (auto& z : zero3_) z->end_micro_batch();
}
void Zero3Sync::before_forward(int unit) {
  for (auto& z : zero3_) z->before_forward(unit);
}
void Zero3Sync::after_forward(int unit) {
  for (auto& z : zero3_) z->after_forward(unit);
}
void Zero3Sync::before_backward(int unit) {
  for (auto& z : zero3_) z->before_backward(unit);
}
void Zero3Sync::after_backward(int unit) {
  for (auto& z : zero3_) z->after_backward(unit);
}
void Zero3Sync::skip_step() {
  for (auto& z : zero3_) z->skip_step();
}
void Zero3Sync::gather_full_parameters() {
  for (auto& z : zero3_) z->gather_full_parameters();
}
void Zero3Sync::release_full_parameters() {
  for (auto& z : zero3_) z->release_full_parameters();
}

double Zero3Sync::hidden_fraction() const {
  double sum = 0.0;
  for (const auto& z : zero3_) sum += z->hidden_fraction();
  return sum / static_cast<double>(zero3_.size());
}

double Zero3Sync::gradient_norm() {
  // The gradient buffer was released unit by unit; the shards hold the reduced gradients.
  std::vector<NormShare> shares;
  for (size_t g = 0; g < zero3_.size(); ++g) {
    shares.push_back(zero3_[g]->norm_share());
    shares.back().partitioned_over = setup_.groups[g].partitioned_over;
    shares.back().counted = setup_.groups[g].norm_counted_here;
  }
  return global_norm(shares, setup_.norm_excluded, setup_.model_groups);
}

void Zero3Sync::update(double lr, int64_t step, double norm) {
  const optim::StepParams at{lr, step, optim::clip_factor(setup_.config->optim, norm)};
  for (auto& z : zero3_) z->update(at);
}

bool Zero3Sync::reduced_gradients_on_host() const {
  return !zero3_.empty() && zero3_.front()->shards_device() != setup_.model->params().device();
}

std::vector<std::span<float>> Zero3Sync::reduced_gradients() {
  std::vector<std::span<float>> out;
  for (auto& z : zero3_) out.emplace_back(z->reduced_gradients(), static_cast<size_t>(z->reduced_gradients_numel()));
  return out;
}

void Zero3Sync::load_moments(const float* exp_avg, const float* exp_avg_sq) {
  for (auto& z : zero3_) {
    z->load_from_full();
    z->load_moments(exp_avg, exp_avg_sq);
  }
}

std::vector<OwnedRange> Zero3Sync::checkpoint_ranges() const {
  std::vector<OwnedRange> out;
  for (const auto& z : zero3_) {
    for (const Zero3::OwnedShard& s : z->shards()) {
      out.push_back({s.begin, s.end, s.value, s.exp_avg, s.exp_avg_sq, s.moments_on_host, s.value_on_host});
    }
  }
  return out;
}

Zero3Memory Zero3Sync::memory() const {
  Zero3Memory total;
  for (const auto& z : zero3_) {
    const Zero3Memory m = z->memory();
    total.parameter_shard += m.parameter_shard;
    total.moments += m.moments;
    total.gradient_shard += m.gradient_shard;
    total.host_parameter_shard += m.host_parameter_shard;
    total.host_moments += m.host_moments;
    total.host_gradient_shard += m.host_gradient_shard;
    total.comm_buffers += m.comm_buffers;
    total.gather_copy += m.gather_copy;
    total.full_parameters += m.full_parameters;
    total.peak_parameters += m.peak_parameters;
    total.peak_gradients += m.peak_gradients;
    total.peak_resident += m.peak_resident;
  }
  return total;
}

std::string Zero3Sync::peak_memory_report() const { return describe_zero3_peak(memory()); }

MemoryBytes Zero3Sync::memory_bytes() const {
  // Persistent state only; the units gathered in flight come on top (peak_memory_report()).
  const Zero3Memory m = memory();
  MemoryBytes bytes{};
  // fp32: the shard is its own master copy; with it in host memory, the device's copy for the gathers
  bytes.parameters = m.parameter_shard + m.gather_copy;
  bytes.gradients = m.gradient_shard;
  bytes.optimizer_moments = m.moments;
  bytes.host_optimizer_moments = m.host_moments;
  bytes.host_parameters = m.host_parameter_shard;
  bytes.host_gradients = m.host_gradient_shard;
  bytes.communication_buffers = m.comm_buffers;
  return bytes;
}

std::string Zero3Sync::memory_report() const {
  std::ostringstream out;
  const std::string params = setup_.param_dtype == DType::F32 ? "fp32" : dtype_name(setup_.param_dtype);
  out << "memory per rank (allocated, " << params << " parameters, fp32 gradients, master weights and moments, zero 3"
      << ", dp " << setup_.dp->size() << "): " << describe_memory(memory_bytes()) << "; plus the units gathered in flight";
  return out.str();
}

}  // namespace loom::parallel
