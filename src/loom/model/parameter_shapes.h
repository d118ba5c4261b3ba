#pragma once
// The parameters a loom model of a given config holds, by global name and shape, without
// building its buffers: the modules register on a shapes-only store (Transformer::parameter_list),
// so converting a large model allocates nothing for it. loom names its parameters as Hugging
// Face's Llama does (`model.layers.3.mlp.up_proj.weight`), so this is also the tensor list of the
// model.safetensors that `loom convert` reads and writes.
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/config/run_config.h"

namespace loom::model {

struct ParameterShape {
  std::string name;
  Shape shape;  // global (unsplit)
};

// In model order: embeddings, then each layer's tensors, then the final norm and the head.
// model.vocab_size must be resolved (> 0).
std::vector<ParameterShape> model_parameter_shapes(const config::ModelConfig& model);

}  // namespace loom::model
