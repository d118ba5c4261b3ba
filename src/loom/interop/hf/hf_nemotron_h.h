#pragma once
// Hybrid models (model.layer_pattern) and Hugging Face's Nemotron-H (architectures
// ["NemotronHForCausalLM"], model_type "nemotron_h"; docs/hybrid.md, docs/interop.md):
//   layer_pattern -> hybrid_override_pattern (M Mamba-2, * attention, - MLP, E MoE), one pre-norm
//   per layer (backbone.layers.N.norm) and one mixer (backbone.layers.N.mixer.*);
//   model.mamba.{heads, head_dim, state_size, groups, conv_kernel, chunk_size} ->
//   mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups, conv_kernel, chunk_size;
//   norm_eps -> layer_norm_epsilon; activation relu2 -> mlp_hidden_act; attention without
//   positions (model.positions none); MoE: sigmoid routing with e_score_correction_bias (loom's
//   expert bias), norm_topk_prob, routed_scaling_factor (model.moe_topk_scaling), squared-ReLU
//   experts behind optional latent projections, one shared expert.
// Mamba's in_proj is loom's in_proj_{z,x,B,C,dt} stacked in that order, conv1d its conv1d_{x,B,C}.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"
#include "loom/interop/hf/hf_tensor_map.h"

namespace loom::interop::hf {

inline constexpr const char* kNemotronHArchitecture = "NemotronHForCausalLM";

inline bool is_nemotron_h_model(const config::ModelConfig& model) { return !model.layer_pattern.empty(); }
// Throws naming the first model.* key Nemotron-H cannot express.
void check_nemotron_h_exportable(const config::ModelConfig& model);
nlohmann::ordered_json nemotron_h_config_json(const config::ModelConfig& model, std::string_view torch_dtype);
// The model a Nemotron-H config.json describes; keys that would change the computation in a way
// loom does not implement are errors naming `where` and the key.
config::ModelConfig nemotron_h_model_config(const nlohmann::json& config, const std::string& where);
// Its tensors (hf_tensor_map.h), in model order.
std::vector<HfTensor> nemotron_h_tensors(const config::ModelConfig& model);

}  // namespace loom::interop::hf
