#pragma once
// Mixture-of-experts models with q/k/v biases or a shared expert and Hugging Face's Qwen2-MoE
// (architectures ["Qwen2MoeForCausalLM"], model_type "qwen2_moe"). Its sparse block is loom's MoE
// layer with a gated shared expert (model.moe_shared_expert_gate):
//   y = sum_topk w_e expert_e(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)
// routed by softmax over every expert then top-k, renormalised over the k when norm_topk_prob
// (= loom's topk_softmax; without it = softmax_topk). Dense layers (mlp_only_layers, and those
// decoder_sparse_step skips) are block_configs entries with ffn: dense of intermediate_size; the
// experts are moe_intermediate_size wide, the shared expert shared_expert_intermediate_size.
// Tensor names are loom's own (model.layers.N.mlp.gate.weight, .mlp.experts.E.{gate,up,down}_proj,
// .mlp.shared_expert.*, .mlp.shared_expert_gate.weight).
#include <string>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"

namespace loom::interop::hf {

inline constexpr const char* kQwen2MoeArchitecture = "Qwen2MoeForCausalLM";

// An MoE model that exports as Qwen2-MoE rather than Mixtral: q/k/v biases or a shared expert.
bool is_qwen2_moe_model(const config::ModelConfig& model);
// Throws naming the first model.* key Qwen2MoeForCausalLM cannot express.
void check_qwen2_moe_exportable(const config::ModelConfig& model);
// Turns a Llama-style config.json into Qwen2-MoE's.
void add_qwen2_moe_config(nlohmann::ordered_json& out, const config::ModelConfig& model);
// Reads Qwen2-MoE's keys into `model` (already holding the attention and dense sizes); keys that
// would change the computation are errors naming `where` and the key.
void read_qwen2_moe_config(const nlohmann::json& config, config::ModelConfig& model, const std::string& where);

}  // namespace loom::interop::hf
