#include "loom/train/outer_step.h"

#include "loom/ckpt/tensor_names.h"
#include "loom/core/error.h"
#include "loom/train/model_setup.h"
#include "loom/train/sharded_training_state.h"

namespace loom::train {

std::unique_ptr<OuterStep> OuterStep::make(const config::RunConfig& config, comm::Communicator& dp) {
  if (config.parallel.outer != config::OuterOptimizer::Diloco) return nullptr;
  LOOM_CHECK(config.parallel.pp == 1 && config.parallel.zero <= 2 &&
                 config.precision.param_dtype == config::ParamDtype::Fp32,
             "parallel.outer=diloco trains with parallel.pp 1, parallel.zero 0, 1 or 2 and precision.param_dtype fp32 "
             "(got pp " + std::to_string(config.parallel.pp) + ", zero " + std::to_string(config.parallel.zero) + ")");
  std::unique_ptr<parallel::SiteGroups> groups = parallel::make_site_groups(dp, parallel::site_of_members(dp, config));
  LOOM_CHECK(groups != nullptr, "parallel.outer=diloco needs at least two sites: set parallel.dp_sites (or "
                                "topology.nodes_per_site with topology.ranks_per_node) so that the " +
                                    std::to_string(dp.size()) + " data-parallel ranks span several");
  return std::unique_ptr<OuterStep>(new OuterStep(config, std::move(groups)));
}

OuterStep::OuterStep(const config::RunConfig& config, std::unique_ptr<parallel::SiteGroups> groups)
    : groups_(std::move(groups)) {
  const config::ParallelConfig& p = config.parallel;
  options_ = {p.outer_steps, p.outer_lr, p.outer_momentum, p.outer_fragments};
}

void OuterStep::attach(model::Transformer& model) {
  model::ParameterStore& params = model.params();
  outer_ = std::make_unique<parallel::DilocoOuter>(*groups_->across.front(), params.values(), params.total(),
                                                   params.device(), options_);
}

bool OuterStep::after_step(int64_t step) { return outer_->after_step(step); }

int64_t OuterStep::take_cross_site_bytes() {
  const int64_t now = outer_->cross_site_bytes(), since = now - reported_bytes_;
  reported_bytes_ = now;
  return since;
}

std::string OuterStep::site_name(const std::string& name) const {
  const std::string site = "site" + std::to_string(groups_->site);
  if (ckpt::is_model_parameter(name)) return ckpt::optimizer_state_name(site + "_value", name);
  return std::string(ckpt::kOptimizerPrefix) + site + "_" + name.substr(ckpt::kOptimizerPrefix.size());
}

std::vector<ckpt::TensorRef> OuterStep::checkpoint_tensors(const model::Transformer& model,
                                                           std::vector<ckpt::TensorRef> inner,
                                                           const std::vector<parallel::OwnedRange>& owned) const {
  if (groups_->site != 0) {
    for (ckpt::TensorRef& ref : inner) ref.name = site_name(ref.name);
    return inner;
  }
  // The outer state over the same ranges, as (value, exp_avg) = (anchor, momentum) refs renamed
  // (read from a GPU into host memory that lives until the next checkpoint).
  std::vector<parallel::OwnedRange> outer;
  for (const parallel::OwnedRange& r : owned) {
    outer.push_back({r.begin, r.end, outer_->anchor() + r.begin, outer_->momentum() + r.begin, nullptr});
  }
  outer = host_ranges(outer_->device(), std::move(outer), saved_from_device_);
  for (ckpt::TensorRef& ref : owned_training_state(model, outer)) {
    if (ckpt::is_model_parameter(ref.name)) {
      ref.name = ckpt::optimizer_state_name("outer_anchor", ref.name);
    } else if (ref.name.rfind(ckpt::optimizer_state_name("exp_avg", ""), 0) == 0) {
      ref.name = ckpt::optimizer_state_name("outer_momentum", ref.name.substr(ckpt::optimizer_state_name("exp_avg", "").size()));
    } else {
      continue;  // the third slot carries nothing
    }
    inner.push_back(ref);
  }
  return inner;
}

void OuterStep::restore(const ckpt::LoadedCheckpoint& checkpoint, model::Transformer& model, float* exp_avg,
                        float* exp_avg_sq) {
  const std::string first = model.params().list().front().name;
  if (!checkpoint.has(ckpt::optimizer_state_name("outer_anchor", first))) {
    outer_->reset();  // a checkpoint without outer state: every site starts from its parameters
    return;
  }
  if (groups_->site != 0) {
    auto named = [&](const std::string& slot) {
      return [this, slot](const std::string& p) { return site_name(slot.empty() ? p : ckpt::optimizer_state_name(slot, p)); };
    };
    read_state(checkpoint, model, named(""), model.params().values());
    read_parameter_state(checkpoint, model, named("exp_avg"), exp_avg);
    read_parameter_state(checkpoint, model, named("exp_avg_sq"), exp_avg_sq);
  }
  read_state(checkpoint, model, [](const std::string& p) { return ckpt::optimizer_state_name("outer_anchor", p); },
             outer_->anchor());
  read_state(checkpoint, model, [](const std::string& p) { return ckpt::optimizer_state_name("outer_momentum", p); },
             outer_->momentum());
}

void OuterStep::read_state(const ckpt::LoadedCheckpoint& checkpoint, const model::Transformer& model,
                           const std::function<std::string(const std::string&)>& name_of, float* out) const {
  const Device device = outer_->device();
  if (device.is_cpu()) return read_parameter_state(checkpoint, model, name_of, out);
  std::vector<float> host(static_cast<size_t>(model.params().total()));  // read on the host, uploaded once
  read_parameter_state(checkpoint, model, name_of, host.data());
  copy_from_host(device, out, host.data(), model.params().total());
}

}  // namespace loom::train
