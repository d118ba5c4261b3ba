#include "loom/parallel/data/bf16_parameter_copy.h"

#include "loom/core/error.h"
#include "loom/kernels/ops.h"

namespace loom::parallel {

bool keeps_bf16_parameter_copy(const config::RunConfig& config) {
  const config::PrecisionRecipe recipe = config.precision.recipe;
  // An optimizer offloaded to the host (optim.cpu_offload) writes no copy.
  return config.runtime.device == config::RuntimeDevice::Cuda && config.parallel.zero == 0 &&
         !config.optim.cpu_offload && config.precision.param_dtype == config::ParamDtype::Fp32 &&
         recipe != config::PrecisionRecipe::Fp32 && recipe != config::PrecisionRecipe::Fp16;
}

Bf16ParameterCopy::Bf16ParameterCopy(const float* values, int64_t total, Device device)
    : values_(values), total_(total), device_(device), copy_({total}, DType::BF16, device) {}

void Bf16ParameterCopy::into_pieces(std::span<optim::ShardPiece> pieces) {
  if (!current_) return;
  auto* copy = static_cast<uint16_t*>(copy_.raw());
  for (optim::ShardPiece& piece : pieces) {
    const int64_t at = piece.param - values_;
    LOOM_CHECK(at >= 0 && at + piece.numel <= total_,
               "Bf16ParameterCopy: an optimizer piece outside the parameter values it copies");
    piece.param_bf16 = copy + at;
  }
}

void Bf16ParameterCopy::after_update() {
  if (!current_) kernels::narrow_floats(device_, copy_.raw(), values_, total_, DType::BF16);
  current_ = true;
}

}  // namespace loom::parallel
