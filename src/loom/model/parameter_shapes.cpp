#include "loom/model/parameter_shapes.h"

#include "loom/core/error.h"
#include "loom/model/transformer.h"

namespace loom::model {

std::vector<ParameterShape> model_parameter_shapes(const config::ModelConfig& model) {
  LOOM_CHECK(model.vocab_size > 0, "model.vocab_size must be resolved before listing the model's parameters");
  std::vector<ParameterShape> out;
  for (const Parameter& p : Transformer::parameter_list(model)) out.push_back({p.name, p.global_shape()});
  return out;
}

}  // namespace loom::model
