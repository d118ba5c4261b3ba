#pragma once
// Where an engine's ranks run and in which number format their GEMMs compute.
//
// Device (`loom serve --device`, EngineOptions::device): `cuda` starts the CUDA backend (an Error
// with the runtime's reason where it cannot) and gives tensor-parallel rank r the GPU r modulo the
// GPUs, as training does with runtime.device.
//
// Dtype (`loom serve --dtype`, EngineOptions::dtype): the linear layers' GEMMs (projections,
// MLPs, the Mamba-2 projections, the output head) in fp32, bf16 or fp16, as precision.recipe does
// in training (model/linear_precision.h): operands rounded to the format, fp32 accumulation,
// outputs rounded to it; on a GPU on tensor cores, each weight cast once after every load and
// kept (model/weight_cast_cache.h); the routed experts' GEMMs in the 16-bit format too
// (MoeLayer::set_precision). Master weights, norms, attention, the Mamba-2 scan and the MoE
// router and latent projections stay fp32. `auto`: bf16 on a GPU (vLLM's default for bf16-trained
// models), fp32 on the CPU (where rounding is emulated: more work, not less).
//
// KV cache dtype (`loom serve --kv-cache-dtype`, EngineOptions::kv_cache_dtype): the elements of
// the paged cache's key and value pools, fp32 or bf16 (half the bytes per position: twice the
// positions in a budget, half the reads of a decoding step's attention). `auto`: bf16 where the
// GEMMs are bf16 or fp16, fp32 where they are fp32. Queries, scores, softmax and the weighted
// sums stay fp32 (bf16 keys and values are widened exactly as they are read).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "loom/config/run_config.h"
#include "loom/core/device.h"
#include "loom/kernels/types.h"
#include "loom/model/linear_precision.h"
#include "loom/model/transformer.h"

namespace loom::infer {

Device inference_device(config::RuntimeDevice device, int rank);

// Named as config/enums.h's enums are (config::name_of, config::parse_name).
enum class InferenceDtype : uint8_t { Auto, Fp32, Bf16, Fp16 };
constexpr std::array<std::string_view, 4> names(InferenceDtype) { return {"auto", "fp32", "bf16", "fp16"}; }
// "auto" | "fp32" | "bf16" | "fp16"; anything else is an Error naming the valid names.
InferenceDtype parse_inference_dtype(const std::string& name);
// The precision recipe the served model's GEMMs take on `device` (auto resolved), and the policy
// an inference model is built with for it: the linear GEMMs in that recipe, attention's products
// fp32 whatever it is (keys and values widened from a bf16 cache as they are read).
config::PrecisionRecipe inference_recipe(InferenceDtype dtype, config::RuntimeDevice device);
model::PrecisionPolicy inference_policy(config::PrecisionRecipe recipe);
// After every weight load on a GPU: each weight's cast kept from the next forward to the next
// load (model/weight_cast_cache.h); nothing on the CPU.
void keep_weight_casts(model::Transformer& model);

enum class KvCacheSetting : uint8_t { Auto, Fp32, Bf16 };
constexpr std::array<std::string_view, 3> names(KvCacheSetting) { return {"auto", "fp32", "bf16"}; }
// "auto" | "fp32" | "bf16"; anything else is an Error naming the valid names.
KvCacheSetting parse_kv_cache_setting(const std::string& name);
// The pools' elements under GEMMs of `recipe` (auto resolved).
kernels::KvCacheDtype kv_cache_dtype(KvCacheSetting setting, config::PrecisionRecipe recipe);

}  // namespace loom::infer
