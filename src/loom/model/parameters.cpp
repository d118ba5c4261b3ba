#include "loom/model/parameters.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/ops.h"

namespace loom::model {

int ParameterStore::add(const std::string& name, Shape shape, Init init, float init_std, ShardSpec shard) {
  LOOM_CHECK(!allocated_, "ParameterStore: parameter '" + name + "' added after allocation");
  const bool added = ids_by_name_.emplace(name, static_cast<int>(params_.size())).second;
  LOOM_CHECK(added, "ParameterStore: duplicate parameter name '" + name + "'");
  Parameter p;
  p.name = name;
  p.numel = shape_numel(shape);
  p.weight_decay = shape.size() >= 2 && name.find("norm") == std::string::npos;
  p.shape = std::move(shape);
  p.offset = total_;
  p.init = init;
  p.init_std = init_std;
  p.shard = std::move(shard);
  total_ += p.numel;
  params_.push_back(std::move(p));
  if (!written_whole_.empty()) {
    written_whole_.push_back(0);
    stale_.push_back(0);
  }
  return static_cast<int>(params_.size()) - 1;
}

void ParameterStore::allocate() {
  allocated_ = true;
  if (shapes_only()) return;
  // Releasable: ZeRO 2 and 3 give ranges of them back between uses (parallel/data/shard_memory.h).
  values_ = DeviceBuffer<float>::releasable(device_, total_);
  grads_ = DeviceBuffer<float>::releasable(device_, total_);
}

namespace {

// A fraction in [0, 1) per global head, spread by the golden ratio (no two heads alike).
float mamba_init(const Parameter& p, int64_t local) {
  const double u = std::fmod(0.5 + 0.6180339887498949 * static_cast<double>(global_index(p.shard, p.shape, local)), 1.0);
  if (p.init == Init::MambaALog) return static_cast<float>(std::log(1.0 + 15.0 * u));
  const double dt = std::exp(std::log(0.001) + u * (std::log(0.1) - std::log(0.001)));
  return static_cast<float>(dt + std::log(-std::expm1(-dt)));  // softplus^-1(dt)
}

}  // namespace

void ParameterStore::initialize(uint64_t seed) {
  if (shapes_only()) return;
  // Drawn on the host: in place on the cpu, else into a staging copy uploaded once.
  std::vector<float> staging(device_.is_cpu() ? 0 : static_cast<size_t>(total_));
  float* base = device_.is_cpu() ? values_.data() : staging.data();
  for (const Parameter& p : params_) {
    float* v = base + p.offset;
    const uint64_t key = philox_key(seed, p.name);
#pragma omp parallel for schedule(static) if(p.numel >= 32768)
    for (int64_t i = 0; i < p.numel; ++i) {
      switch (p.init) {
        case Init::Normal:
          v[i] = p.init_std * philox_normal(key, static_cast<uint64_t>(global_index(p.shard, p.shape, i)));
          break;
        case Init::Ones: v[i] = 1.0f; break;
        case Init::Zeros: v[i] = 0.0f; break;
        case Init::MambaALog:
        case Init::MambaDtBias: v[i] = mamba_init(p, i); break;
      }
    }
  }
  if (!device_.is_cpu()) copy_from_host(device_, values_.data(), staging.data(), total_);
}

std::pair<int, int> ParameterStore::ids_spanning(int64_t offset, int64_t numel) const {
  auto at = [&](int64_t where) {  // the parameter starting at `where` (params_.size() at the end)
    auto it = std::lower_bound(params_.begin(), params_.end(), where,
                               [](const Parameter& p, int64_t o) { return p.offset < o; });
    LOOM_CHECK(where == total_ || (it != params_.end() && it->offset == where),
               "ParameterStore: gradient range [" + std::to_string(offset) + ", " + std::to_string(offset + numel) +
                   ") does not start and end on parameters (the store holds " + std::to_string(total_) +
                   " elements)");
    return static_cast<int>(it - params_.begin());
  };
  LOOM_CHECK(offset >= 0 && numel > 0 && offset + numel <= total_,
             "ParameterStore: gradient range of " + std::to_string(numel) + " elements at " + std::to_string(offset) +
                 " outside the store's " + std::to_string(total_));
  return {at(offset), at(offset + numel)};
}

void ParameterStore::mark_written_whole(int64_t offset, int64_t numel) {
  const auto [first, end] = ids_spanning(offset, numel);
  written_whole_.resize(params_.size(), 0);
  stale_.resize(params_.size(), 0);
  for (int id = first; id < end; ++id) written_whole_[static_cast<size_t>(id)] = 1;
}

namespace {
// Parameter `p`'s gradient range added to `runs`, joined to the last run where it follows it.
void add_run(std::vector<kernels::FloatRun>& runs, const Parameter& p) {
  if (!runs.empty() && runs.back().begin + runs.back().n == p.offset) {
    runs.back().n += p.numel;
  } else {
    runs.push_back({p.offset, p.numel});
  }
}
}  // namespace

void ParameterStore::zero_grads() {
  if (written_whole_.empty()) return grads_.zero();
  if (shapes_only() || total_ == 0) return;
  // The runs between the ranges written whole, in one device call.
  std::vector<kernels::FloatRun> runs;
  for (size_t id = 0; id < params_.size(); ++id) {
    if (written_whole_[id] != 0) {
      stale_count_ += stale_[id] == 0 ? 1 : 0;
      stale_[id] = 1;
      continue;
    }
    add_run(runs, params_[id]);
  }
  kernels::zero_runs(device_, grads_.data(), runs);
}

void ParameterStore::zero_stale(std::span<const int> ids) {
  std::vector<kernels::FloatRun> runs;
  for (const int id : ids) {
    if (!stale(id)) continue;
    stale_[static_cast<size_t>(id)] = 0;
    --stale_count_;
    add_run(runs, params_[static_cast<size_t>(id)]);
  }
  kernels::zero_runs(device_, grads_.data(), runs);
}

bool ParameterStore::take_written_whole(int64_t offset, int64_t numel) {
  if (stale_count_ == 0) return false;
  const auto [first, end] = ids_spanning(offset, numel);
  bool all_stale = true;
  for (int id = first; id < end; ++id) all_stale = all_stale && stale(id);
  if (all_stale) {
    for (int id = first; id < end; ++id) stale_[static_cast<size_t>(id)] = 0;
    stale_count_ -= end - first;
    return true;
  }
  std::vector<int> ids(static_cast<size_t>(end - first));
  std::iota(ids.begin(), ids.end(), first);
  zero_stale(ids);
  return false;
}

void ParameterStore::settle_grads(std::span<const int> ids) {
  if (stale_count_ > 0) zero_stale(ids);
}

int ParameterStore::find(const std::string& name) const {
  const auto it = ids_by_name_.find(name);
  return it == ids_by_name_.end() ? -1 : it->second;
}

}  // namespace loom::model
