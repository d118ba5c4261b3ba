#include "loom/model/parameters.h"

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
  values_ = DeviceBuffer<float>(device_, total_);
  grads_ = DeviceBuffer<float>(device_, total_);
}

void ParameterStore::initialize(uint64_t seed) {
  if (shapes_only()) return;
  LOOM_CHECK(device_.is_cpu(), "ParameterStore::initialize: initial values are drawn on the host; " + device_.name() +
                                   " needs a host staging copy (not built yet)");
  for (const Parameter& p : params_) {
    float* v = values_.data() + p.offset;
    const uint64_t key = philox_key(seed, p.name);
#pragma omp parallel for schedule(static) if(p.numel >= 32768)
    for (int64_t i = 0; i < p.numel; ++i) {
      switch (p.init) {
        case Init::Normal:
          v[i] = p.init_std * philox_normal(key, static_cast<uint64_t>(global_index(p.shard, p.shape, i)));
          break;
        case Init::Ones: v[i] = 1.0f; break;
        case Init::Zeros: v[i] = 0.0f; break;
      }
    }
  }
}

int ParameterStore::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace loom::model
