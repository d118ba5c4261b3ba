#include "loom/model/parameter_shapes.h"

#include "loom/core/error.h"
#include "loom/model/layer_spec.h"

namespace loom::model {

std::vector<ParameterShape> model_parameter_shapes(const config::ModelConfig& model) {
  LOOM_CHECK(model.vocab_size > 0, "model.vocab_size must be resolved before listing the model's parameters");
  const int64_t V = model.vocab_size, C = model.d_model, hd = model::head_dim(model);
  const bool layer_norm = model.norm == "layer";
  std::vector<ParameterShape> out;
  auto add = [&](std::string name, Shape shape) { out.push_back({std::move(name), std::move(shape)}); };
  auto norm = [&](const std::string& prefix) {
    add(prefix + ".weight", {C});
    if (layer_norm) add(prefix + ".bias", {C});
  };
  // Linear weights are [out, in] (as torch.nn.Linear); biases [out] exist with model.bias.
  auto linear = [&](const std::string& prefix, int64_t out_features, int64_t in_features) {
    add(prefix + ".weight", {out_features, in_features});
  };
  auto bias = [&](const std::string& prefix, int64_t out_features) {
    if (model.bias) add(prefix + ".bias", {out_features});
  };

  add("model.embed_tokens.weight", {V, C});
  if (model.positions == "learned") add("model.embed_positions.weight", {model.max_seq_len, C});
  const std::vector<model::LayerSpec> specs = model::resolve_layers(model);
  for (int l = 0; l < model.layers; ++l) {
    const model::LayerSpec& spec = specs[static_cast<size_t>(l)];
    const std::string prefix = "model.layers." + std::to_string(l);
    if (spec.has_attention) {
      norm(prefix + ".input_layernorm");
      const std::string a = prefix + ".self_attn";
      const int64_t q = model.heads * hd, kv = spec.kv_heads * hd;
      linear(a + ".q_proj", q, C);
      linear(a + ".k_proj", kv, C);
      linear(a + ".v_proj", kv, C);
      bias(a + ".q_proj", q);
      bias(a + ".k_proj", kv);
      bias(a + ".v_proj", kv);
      linear(a + ".o_proj", C, q);
      bias(a + ".o_proj", C);
    }
    if (spec.has_mlp()) {
      norm(prefix + ".post_attention_layernorm");
      const std::string m = prefix + ".mlp";
      const int64_t F = spec.ffn_size;
      if (model.activation == "swiglu") {
        linear(m + ".gate_proj", F, C);
        linear(m + ".up_proj", F, C);
        bias(m + ".gate_proj", F);
        bias(m + ".up_proj", F);
      } else {
        linear(m + ".up_proj", F, C);
        bias(m + ".up_proj", F);
      }
      linear(m + ".down_proj", C, F);
      bias(m + ".down_proj", C);
    }
  }
  norm("model.norm");
  if (!model.tied_embeddings) add("lm_head.weight", {V, C});
  return out;
}

}  // namespace loom::model
