#pragma once
// loom's model config <-> a Hugging Face config.json, in both directions (see docs/interop.md).
//
// Homogeneous models map to Llama (architectures ["LlamaForCausalLM"], model_type "llama"):
//   d_model -> hidden_size, ffn_size -> intermediate_size, layers -> num_hidden_layers,
//   heads -> num_attention_heads, kv_heads (0 = heads) -> num_key_value_heads,
//   d_model / heads -> head_dim, vocab_size -> vocab_size, max_seq_len -> max_position_embeddings,
//   norm_eps -> rms_norm_eps, rope_theta -> rope_theta, tied_embeddings -> tie_word_embeddings,
//   bias -> attention_bias and mlp_bias, init_std -> initializer_range, hidden_act "silu".
// Heterogeneous models (model.block_configs) map to DeciLM / Nemotron-NAS
// (architectures ["DeciLMForCausalLM"], model_type "nemotron-nas"): the fields above plus
// block_configs, one per layer:
//   {"attention": {"no_op": attention == skip, "n_heads_in_group": heads / kv_heads, or null
//                  when no_op, "replace_with_linear": false},
//    "ffn": {"no_op": ffn_size == 0, "ffn_mult": m, "replace_with_linear": false}}
// where ffn_mult is written only when DeciLM's rule (round_up(int(2 * m * d_model / 3), 256))
// gives back the layer's ffn size exactly; otherwise "intermediate_size": ffn_size (a loom
// extension that DeciLM's own modeling code does not read).
// MoE models map to Mixtral (hf_moe.h) or Qwen2-MoE (hf_qwen2_moe.h), hybrid models
// (model.layer_pattern) to Nemotron-H (hf_nemotron_h.h).
// Otherwise only Llama-style loom models export: norm rms, activation swiglu, positions rope. GPT-2 style
// ones (LayerNorm, GELU, learned positions) are an error naming the key, because
// LlamaForCausalLM cannot compute them and a GPT-2 export would need fused, transposed weights.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loom/config/run_config.h"

namespace loom::interop::hf {

// model.qkv_bias without model.bias: q/k/v biases only, which Qwen2ForCausalLM (model_type
// "qwen2") computes; its config.json has no attention_bias / mlp_bias, and use_sliding_window
// must be false. RoPE scaling: see hf_rope.h.
inline bool is_qwen2_model(const config::ModelConfig& model) { return model.qkv_bias && !model.bias; }

// Throws naming the first model.* key whose value Llama / DeciLM cannot express.
void check_hf_exportable(const config::ModelConfig& model);

// config.json for `model` (vocab_size resolved); `torch_dtype` is "float32" or "bfloat16".
nlohmann::ordered_json hf_config_json(const config::ModelConfig& model, std::string_view torch_dtype);

// The model config a config.json describes. Reads the keys above (defaults as Hugging Face's
// LlamaConfig: rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false, ...); keys that
// would change the computation in a way loom does not implement (rope_scaling, hidden_act other
// than silu, head_dim other than hidden_size / num_attention_heads, attention_bias != mlp_bias,
// DeciLM block options other than no_op / n_heads_in_group / ffn_mult / intermediate_size with
// a value other than null, false or 0) are errors naming `where` and the key; other keys
// (token ids, transformers_version, ...) are ignored.
config::ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& where);

// DeciLM's ffn size for a multiplier: round_up(int(2 * ffn_mult * hidden_size / 3), 256).
// nullopt when ffn_mult is not a finite positive number giving a size that fits an int.
std::optional<int> decilm_intermediate_size(double ffn_mult, int hidden_size);
// The multiplier that gives back `ffn_size` exactly under that rule, if there is one.
std::optional<double> decilm_ffn_mult(int ffn_size, int hidden_size);

}  // namespace loom::interop::hf
