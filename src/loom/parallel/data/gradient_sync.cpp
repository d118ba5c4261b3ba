#include "loom/parallel/data/gradient_sync.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/parallel/data/ddp_sync.h"
#include "loom/parallel/data/parameter_dtype.h"
#include "loom/parallel/data/sharded_sync.h"
#include "loom/parallel/data/sync_setup.h"
#include "loom/parallel/data/zero3_sync.h"

namespace loom::parallel {

namespace {

// Parameters this rank leaves out of the gradient norm (another tensor-parallel rank counts
// them), as merged flat ranges in order.
std::vector<FlatRange> norm_excluded(const model::ParameterStore& params) {
  std::vector<FlatRange> out;
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

void check_groups(const std::vector<ParameterGroup>& groups, int parameters) {
  std::vector<int> owner(static_cast<size_t>(parameters), -1);
  for (size_t g = 0; g < groups.size(); ++g) {
    LOOM_CHECK(groups[g].comm != nullptr, "parameter group '" + groups[g].name + "' has no communicator");
    for (int id : groups[g].params) {
      LOOM_CHECK(id >= 0 && id < parameters, "parameter group '" + groups[g].name + "' lists parameter " +
                                                 std::to_string(id) + " of " + std::to_string(parameters));
      LOOM_CHECK(owner[id] < 0, "parameter " + std::to_string(id) + " is in two parameter groups");
      owner[id] = static_cast<int>(g);
    }
  }
  for (int id = 0; id < parameters; ++id) {
    LOOM_CHECK(owner[id] >= 0, "parameter " + std::to_string(id) + " is in no parameter group");
  }
}

// More than one site: the site groups over the data-parallel group and the cross-site thread.
std::shared_ptr<SiteReduction> make_site_reduction(comm::Communicator& dp, const config::RunConfig& config,
                                                   const std::vector<ParameterGroup>& groups) {
  // DiLoCo: `dp` is already one site's ranks; the sites meet in the outer step only.
  if (config.parallel.outer == config::OuterOptimizer::Diloco) return nullptr;
  std::unique_ptr<SiteGroups> sites = make_site_groups(dp, site_of_members(dp, config));
  if (!sites) return nullptr;
  const int zero = config.parallel.zero;
  LOOM_CHECK(zero <= 2, "parallel.zero=3 is not supported across sites (parallel.dp_sites or topology.nodes_per_site "
                        "gives " + std::to_string(sites->sites) + "); use parallel.zero 0, 1 or 2");
  LOOM_CHECK(groups.size() == 1 && groups.front().comm == &dp,
             "training across sites reduces one parameter group over the data-parallel group; this model has " +
                 std::to_string(groups.size()) + " parameter groups");
  auto site = std::make_shared<SiteReduction>();
  site->groups = std::move(sites);
  std::vector<comm::Communicator*> channels;
  for (const auto& c : site->groups->across) channels.push_back(c.get());
  site->worker = std::make_unique<CrossSiteWorker>(std::move(channels), site->groups->in_site_gather.get());
  site->cross = config.parallel.cross_site_reduce == config::GradReduce::Bf16 ? DType::BF16 : DType::F32;
  return site;
}

SyncSetup make_setup(comm::Communicator& dp, model::Transformer& model, const config::RunConfig& config,
                     GradientSyncOptions options) {
  SyncSetup s;
  s.dp = &dp;
  s.model = &model;
  s.config = &config;
  const int zero = config.parallel.zero;
  const model::ParameterStore& params = model.params();
  const std::vector<int> ready = model.gradient_ready_unit();
  s.ready_by_unit.resize(model.units());
  for (size_t id = 0; id < ready.size(); ++id) s.ready_by_unit[ready[id]].push_back(static_cast<int>(id));
  if (comm::Communicator* tp = model.tensor_parallel().group(); tp != nullptr && tp->size() > 1) {
    s.model_groups.push_back(tp);
  }
  if (options.pp != nullptr && options.pp->size() > 1) {
    LOOM_CHECK(zero != 3, "parallel.zero=3 shards every parameter over the data-parallel ranks around each unit; with "
                          "pipeline parallelism (parallel.pp > 1) use parallel.zero 0, 1 or 2");
    s.model_groups.push_back(options.pp);
  }
  s.norm_excluded = norm_excluded(params);
  if (options.groups.empty()) {
    ParameterGroup dense{"dense", {}, &dp};
    for (int id = 0; id < static_cast<int>(params.list().size()); ++id) dense.params.push_back(id);
    options.groups.push_back(std::move(dense));
  }
  check_groups(options.groups, static_cast<int>(params.list().size()));
  s.groups = std::move(options.groups);
  s.param_dtype = parameter_dtype(config);
  s.pipeline = options.pipeline;
  LOOM_CHECK(zero != 3 || s.pipeline.tied_param < 0, "an embedding on two pipeline stages (tied embeddings, or model.mtp_depths > 0) needs "
                                             "parallel.zero 0, 1 or 2");
  s.site = make_site_reduction(dp, config, s.groups);
  return s;
}

}  // namespace

DType SyncSetup::wire(const comm::Communicator& group) const {
  return config->precision.grad_reduce == config::GradReduce::Bf16 && group.size() > 1 ? DType::BF16 : DType::F32;
}

std::vector<ParamRange> param_ranges(const model::ParameterStore& params) {
  std::vector<ParamRange> ranges;
  for (const model::Parameter& p : params.list()) ranges.push_back({p.offset, p.numel});
  return ranges;
}

std::vector<Lane> make_lanes(const SyncSetup& setup, std::vector<int>& lane_of) {
  const std::vector<ParamRange> ranges = param_ranges(setup.model->params());
  lane_of.assign(ranges.size(), -1);
  std::vector<Lane> lanes;
  for (size_t g = 0; g < setup.groups.size(); ++g) {
    std::vector<int> ids = setup.groups[g].params;
    std::sort(ids.begin(), ids.end());
    for (int id : ids) {
      const bool extends = !lanes.empty() && lanes.back().group == static_cast<int>(g) &&
                           lanes.back().first + static_cast<int>(lanes.back().params.size()) == id;
      if (!extends) lanes.push_back({static_cast<int>(g), setup.groups[g].comm, id, {}});
      lanes.back().params.push_back(ranges[id]);
      lane_of[id] = static_cast<int>(lanes.size()) - 1;
    }
  }
  return lanes;
}

std::vector<std::vector<FlatRange>> unit_flat_ranges(const model::Transformer& model) {
  const model::ParameterStore& params = model.params();
  std::vector<std::vector<FlatRange>> units;
  for (int u = 0; u < model.units(); ++u) {
    std::vector<FlatRange> ranges;
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
  return units;
}

std::unique_ptr<GradientSync> make_gradient_sync(comm::Communicator& dp, model::Transformer& model,
                                                 const config::RunConfig& config, GradientSyncOptions options) {
  const int zero = config.parallel.zero;
  LOOM_CHECK(zero >= 0 && zero <= 3,
             "parallel.zero " + std::to_string(zero) + " is not supported by this trainer (valid: 0, 1, 2, 3)");
  SyncSetup setup = make_setup(dp, model, config, std::move(options));
  if (zero == 0) return std::make_unique<DdpSync>(std::move(setup));
  if (zero == 3) return std::make_unique<Zero3Sync>(std::move(setup));
  return std::make_unique<ShardedSync>(std::move(setup));
}

}  // namespace loom::parallel
