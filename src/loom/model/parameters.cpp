#include "loom/model/parameters.h"

#include <cmath>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/philox.h"

namespace loom::model {

int ParameterStore::add(const std::string& name, Shape shape, Init init, float init_std, ShardSpec shard) {
  LOOM_CHECK(!allocated_, "ParameterStore: parameter '" + name + "' added after allocation");
  LOOM_CHECK(find(name) < 0, "ParameterStore: duplicate parameter name '" + name + "'");
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

int ParameterStore::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace loom::model
