#include "loom/infer/inference_device.h"

#include <string>

#include "loom/config/enums.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda_entries.h"

namespace loom::infer {

Device inference_device(config::RuntimeDevice device, int rank) {
  if (device == config::RuntimeDevice::Cpu) return Device::cpu();
  int devices = 0;
  try {
    devices = kernels::start_cuda();
  } catch (const Error& e) {
    throw Error(std::string("--device cuda: ") + e.what());
  }
  LOOM_CHECK(devices > 0, "--device cuda: the CUDA backend serves no GPU");
  return Device::cuda(rank % devices);
}

InferenceDtype parse_inference_dtype(const std::string& name) {
  return config::parse_name<InferenceDtype>(name, "dtype");
}

config::PrecisionRecipe inference_recipe(InferenceDtype dtype, config::RuntimeDevice device) {
  switch (dtype) {
    case InferenceDtype::Auto:
      return device == config::RuntimeDevice::Cuda ? config::PrecisionRecipe::Bf16 : config::PrecisionRecipe::Fp32;
    case InferenceDtype::Fp32: return config::PrecisionRecipe::Fp32;
    case InferenceDtype::Bf16: return config::PrecisionRecipe::Bf16;
    case InferenceDtype::Fp16: return config::PrecisionRecipe::Fp16;
  }
  return config::PrecisionRecipe::Fp32;
}

model::PrecisionPolicy inference_policy(config::PrecisionRecipe recipe) {
  model::PrecisionPolicy policy;
  policy.recipe = recipe;
  policy.attention = config::AttentionPrecision::Fp32;
  return policy;
}

void keep_weight_casts(model::Transformer& model) {
  if (model.params().device().is_cuda()) model.precision().weight_casts().open();
}

KvCacheSetting parse_kv_cache_setting(const std::string& name) {
  return config::parse_name<KvCacheSetting>(name, "kv_cache_dtype");
}

kernels::KvCacheDtype kv_cache_dtype(KvCacheSetting setting, config::PrecisionRecipe recipe) {
  switch (setting) {
    case KvCacheSetting::Auto:
      return recipe == config::PrecisionRecipe::Bf16 || recipe == config::PrecisionRecipe::Fp16
                 ? kernels::KvCacheDtype::Bf16
                 : kernels::KvCacheDtype::Fp32;
    case KvCacheSetting::Fp32: return kernels::KvCacheDtype::Fp32;
    case KvCacheSetting::Bf16: return kernels::KvCacheDtype::Bf16;
  }
  return kernels::KvCacheDtype::Fp32;
}

}  // namespace loom::infer
