#include "loom/parallel/data/parameter_dtype.h"

namespace loom::parallel {

DType parameter_dtype(const config::RunConfig& config) {
  const config::PrecisionConfig& p = config.precision;
  if (p.param_dtype != config::ParamDtype::Compute || p.recipe == config::PrecisionRecipe::Fp32) return DType::F32;
  return p.recipe == config::PrecisionRecipe::Fp16 ? DType::F16 : DType::BF16;
}

}  // namespace loom::parallel
