#include "loom/parallel/data/ddp_sync.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "loom/kernels/ops.h"
#include "loom/parallel/data/global_norm.h"

namespace loom::parallel {

DdpSync::DdpSync(SyncSetup setup)
    : BucketedSync(std::move(setup)),
      optimizer_(optim::make_optimizer(setup_.config->optim, setup_.model->params().device())) {
  model::ParameterStore& params = model_.params();
  segments_ = optimizer_segments(params);
  // The moments live with the parameters (on their device), or in part on the host (optim.cpu_offload).
  const int64_t on_host = optim::offloaded_elements(setup_.config->optim, !params.device().is_cpu(), params.total());
  moments_ = optim::MomentArrays(params.total(), on_host, params.device());
  const int64_t bucket_bytes = static_cast<int64_t>(setup_.config->parallel.bucket_mb * 1024.0 * 1024.0);
  for (const Lane& lane : lanes_) {
    if (lane.comm->size() == 1) {
      reducers_.emplace_back();
      continue;
    }
    // Across sites the buckets are padded for the reduce-scatter inside a site.
    const int shard_ranks = setup_.site ? setup_.site->ranks_per_site() : 1;
    reducers_.push_back(std::make_unique<GradReducer>(*lane.comm, params.grads(),
                                                      make_buckets(lane.params, bucket_bytes, shard_ranks),
                                                      comm::ReduceOp::Sum, setup_.wire(*lane.comm), setup_.site.get(),
                                                      params.device()));
  }
  if (setup_.param_dtype != DType::F32) {
    master_ = Tensor({params.total()}, DType::F32, params.device());
    copy_on_device(params.device(), master_.data<float>(), params.values(), params.total());
    compact_store_ = Tensor({params.total()}, setup_.param_dtype, params.device());
    use_compact_parameters(compact_store_.data<std::byte>());
  }
  if (keeps_bf16_parameter_copy(*setup_.config) && optimizer_->writes_bf16_copies() && !params.device().is_cpu())
    bf16_copy_ = std::make_unique<Bf16ParameterCopy>(params.values(), params.total(), params.device());
  if (keeps_fp8_weight_casts(*setup_.config) && optimizer_->writes_bf16_copies() && !params.device().is_cpu()) {
    fp8_weights_ = &model_.precision().optimizer_weight_casts();
    fp8_weights_->enable(params.device());
  }
}

bool DdpSync::reduces() const {
  return std::any_of(reducers_.begin(), reducers_.end(), [](const auto& r) { return r != nullptr; });
}

void DdpSync::mark_ready(int lane, int local) {
  if (reducers_[lane]) reducers_[lane]->mark_ready(local);
}

void DdpSync::finish_round(bool last) {
  if (!last) return;
  for (auto& r : reducers_) {
    if (r) r->finish();
  }
}

double DdpSync::gradient_norm() {
  model::ParameterStore& params = model_.params();
  // Gradients are whole on every rank of a group: the norm sums this rank's shard of the model
  // over the tensor-parallel group, each replicated copy counted once.
  std::vector<NormShare> shares;
  for (const Lane& lane : lanes_) {
    shares.push_back({{{params.grads() + lane.range().begin, lane.range()}},
                      nullptr,
                      setup_.groups[lane.group].partitioned_over,
                      params.device(),
                      setup_.groups[lane.group].norm_counted_here});
  }
  return global_norm(shares, setup_.norm_excluded, setup_.model_groups);
}

void DdpSync::update(double lr, int64_t step, double norm) {
  model::ParameterStore& params = model_.params();
  const optim::StepParams at{lr, step, optim::clip_factor(setup_.config->optim, norm)};
  float* target = master_.empty() ? params.values() : master_.data<float>();
  std::vector<optim::ShardPiece> pieces;
  for (const optim::Segment& s : segments_) {
    for (const optim::MomentArrays::Part& part : moments_.parts(s.offset, s.numel)) {
      pieces.push_back({target + part.begin, params.grads() + part.begin, {part.exp_avg, part.exp_avg_sq}, part.n,
                        s.weight_decay, s.lr_scale});
      pieces.back().state_on_host = part.on_host;
    }
  }
  if (bf16_copy_) bf16_copy_->into_pieces(pieces);
  // bf16 compact parameters: the optimizer's pass writes them too (the values it does not update
  // never change), as it writes the bf16 copy; fp16 ones are rounded from the masters after it.
  const bool compact_bf16 = !master_.empty() && setup_.param_dtype == DType::BF16 && optimizer_->writes_bf16_copies();
  if (compact_bf16) {
    auto* store = static_cast<uint16_t*>(compact_store_.raw());
    for (optim::ShardPiece& p : pieces) p.param_bf16 = store + (p.param - target);
  }
  // The FP8 weights' amaxes and codes for the next step's forwards (the step's history committed);
  // last, as it may join a weight's pieces into one.
  std::vector<model::OptimizerWeightCasts::Entry*> fp8_written;
  if (fp8_weights_ != nullptr) fp8_written = give_fp8_weights(pieces, fp8_weights_->targets());
  optimizer_->update_many(pieces, at);
  if (bf16_copy_) bf16_copy_->after_update();
  if (fp8_weights_ != nullptr) fp8_weights_->written(fp8_written);
  if (!master_.empty() && !compact_bf16) {
    kernels::narrow_floats(params.device(), compact_store_.raw(), master_.data<float>(), params.total(),
                           setup_.param_dtype);
  }
  clear_gradients();
  close_step_traffic(blocked_seconds());
}

std::vector<std::span<float>> DdpSync::reduced_gradients() {
  return {{model_.params().grads(), static_cast<size_t>(model_.params().total())}};
}

void DdpSync::skip_step() {
  clear_gradients();
  close_step_traffic(blocked_seconds());
}

double DdpSync::blocked_seconds() const {
  double s = 0.0;
  for (const auto& r : reducers_) {
    if (r) s += r->total_stats().blocked_s;
  }
  return s;
}

std::vector<OwnedRange> DdpSync::checkpoint_ranges() const {
  // Every rank of a group holds the group's parameters: each writes an even part of each lane
  // (of the master weights, when the parameters are rounded copies of them).
  const float* values = master_.empty() ? model_.params().values() : master_.data<float>();
  std::vector<OwnedRange> out;
  for (const Lane& lane : lanes_) {
    const FlatRange range = lane.range();
    const int64_t n = range.end - range.begin;
    const int64_t begin = range.begin + model::balanced_first(n, lane.comm->size(), lane.comm->rank());
    const int64_t end = range.begin + model::balanced_first(n, lane.comm->size(), lane.comm->rank() + 1);
    for (const optim::MomentArrays::Part& part : moments_.parts(begin, end - begin)) {
      out.push_back(
          {part.begin, part.begin + part.n, values + part.begin, part.exp_avg, part.exp_avg_sq, part.on_host});
    }
  }
  return out;
}

void DdpSync::load_moments(const float* exp_avg, const float* exp_avg_sq) {
  const int64_t total = model_.params().total();
  const Device device = model_.params().device();
  for (const optim::MomentArrays::Part& part : moments_.parts(0, total)) {
    copy_from_host(part.device, part.exp_avg, exp_avg + part.begin, part.n);
    copy_from_host(part.device, part.exp_avg_sq, exp_avg_sq + part.begin, part.n);
  }
  if (compact_) {  // the checkpoint holds the master weights, loaded into the values
    copy_on_device(device, master_.data<float>(), model_.params().values(), total);
    compact_->store_from_values();
  }
  if (bf16_copy_) bf16_copy_->invalidate();  // the values came from the checkpoint
  if (fp8_weights_ != nullptr) fp8_weights_->invalidate();
}

void DdpSync::parameters_changed() {
  if (bf16_copy_) bf16_copy_->invalidate();
  if (fp8_weights_ != nullptr) fp8_weights_->invalidate();
}

double DdpSync::hidden_fraction() const {
  OverlapStats total;
  for (const auto& r : reducers_) {
    if (r) total.add(r->total_stats());
  }
  return total.hidden_fraction();
}

MemoryBytes DdpSync::memory_bytes() const {
  const int64_t total = model_.params().total();
  MemoryBytes bytes{};
  // Compact parameters: 2 bytes each, the fp32 values resident only for the unit in flight.
  bytes.parameters = compact_ ? total * static_cast<int64_t>(dtype_size(setup_.param_dtype)) : total * 4;
  if (bf16_copy_) bytes.parameters += bf16_copy_->bytes();
  bytes.gradients = total * 4;
  bytes.optimizer_moments = moments_.device_elements() * 8;
  bytes.host_optimizer_moments = moments_.host_elements() * 8;
  bytes.master_weights = master_.numel() * 4;  // param_dtype=compute
  return bytes;
}

std::string DdpSync::memory_report() const {
  std::string out = memory_header();
  if (compact_) out += "; plus the fp32 values of the unit in flight";
  if (bf16_copy_) out += " (parameters: the fp32 values and the bf16 copy the optimizer writes for the GEMMs)";
  return out;
}

}  // namespace loom::parallel
