#include "loom/interop/hf/hf_tensor_map.h"

#include "loom/interop/hf/hf_moe.h"
#include "loom/interop/hf/hf_nemotron_h.h"
#include "loom/model/parameter_shapes.h"

namespace loom::interop::hf {

std::vector<HfTensor> hf_tensors(const config::ModelConfig& model) {
  if (is_nemotron_h_model(model)) return nemotron_h_tensors(model);
  std::vector<HfTensor> out;
  for (const model::ParameterShape& p : model::model_parameter_shapes(model))
    out.push_back({hf_tensor_name(model, p.name), p.shape, {{p.name, p.shape}}, false});
  return out;
}

}  // namespace loom::interop::hf
