#include "loom/infer/inference_device.h"

#include <string>

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
  if (name == "auto") return InferenceDtype::Auto;
  if (name == "fp32") return InferenceDtype::Fp32;
  if (name == "bf16") return InferenceDtype::Bf16;
  if (name == "fp16") return InferenceDtype::Fp16;
  throw Error("dtype '" + name + "' is not one of auto, fp32, bf16, fp16");
}

std::string inference_dtype_name(InferenceDtype dtype) {
  switch (dtype) {
    case InferenceDtype::Auto: return "auto";
    case InferenceDtype::Fp32: return "fp32";
    case InferenceDtype::Bf16: return "bf16";
    case InferenceDtype::Fp16: return "fp16";
  }
  return "auto";
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

KvCacheSetting parse_kv_cache_setting(const std::string& name) {
  if (name == "auto") return KvCacheSetting::Auto;
  if (name == "fp32") return KvCacheSetting::Fp32;
  if (name == "bf16") return KvCacheSetting::Bf16;
  throw Error("KV cache dtype '" + name + "' is not one of auto, fp32, bf16");
}

std::string kv_cache_setting_name(KvCacheSetting setting) {
  switch (setting) {
    case KvCacheSetting::Auto: return "auto";
    case KvCacheSetting::Fp32: return "fp32";
    case KvCacheSetting::Bf16: return "bf16";
  }
  return "auto";
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
