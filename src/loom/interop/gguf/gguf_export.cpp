#include "loom/interop/gguf/gguf_export.h"

#include <cstring>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/config/run_config.h"
#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/interop/gguf/gguf_nemotron_h.h"
#include "loom/interop/gguf/gguf_tokenizer.h"
#include "loom/interop/gguf/gguf_writer.h"
#include "loom/interop/hf/hf_nemotron_h.h"
#include "loom/kernels/types.h"
#include "loom/model/layer_spec.h"
#include "loom/train/model_setup.h"

namespace loom::interop::gguf {

namespace {

// llama.cpp's architecture for a transformer (a hybrid's is `nemotron_h`, gguf_nemotron_h.h):
// `qwen2` for q/k/v biases (Qwen 2), `qwen2moe` with experts too, `deci` for heterogeneous layers,
// else `llama`.
std::string transformer_arch(const config::ModelConfig& m) {
  if (m.qkv_bias) return m.moe.experts > 0 ? "qwen2moe" : "qwen2";
  return m.block_configs.empty() ? "llama" : "deci";
}

// What llama.cpp's `llama` architecture runs (with a mixture of experts in every layer, as
// Mixtral), its `qwen2` and `qwen2moe` (Qwen 2's biases, and its MoE's shared expert), and its
// `deci` (Nemotron-NAS) for heterogeneous layers: a refused model names the key, what it is, and why.
void check_exportable(const config::ModelConfig& m, const std::vector<model::LayerSpec>& layers) {
  auto refuse = [](const std::string& key, const std::string& value, const std::string& why) {
    throw Error("loom convert --to-gguf: " + key + " is " + value + "; " + why);
  };
  const std::string llama_style =
      "the GGUF export writes llama.cpp's `llama` architecture, `qwen2` for model.qkv_bias, or `deci` for "
      "model.block_configs (model.norm rms, model.activation swiglu, model.positions rope, model.bias false, "
      "model.rope_scaling none or llama3)";
  if (m.norm != config::Norm::Rms) refuse("model.norm", "layer", llama_style);
  if (m.activation != config::Activation::Swiglu) refuse("model.activation", "gelu", llama_style);
  if (m.positions != config::Positions::Rope) refuse("model.positions", config::to_string(m.positions), llama_style);
  if (m.bias) refuse("model.bias", "true", llama_style);
  if (m.rope_scaling == config::RopeScaling::Yarn) refuse("model.rope_scaling", "yarn", llama_style);
  const std::string arch = transformer_arch(m);
  if (m.qkv_bias && m.rope_scaling != config::RopeScaling::None) {
    refuse("model.rope_scaling", config::to_string(m.rope_scaling), "llama.cpp's `" + arch + "` takes no RoPE factors");
  }
  if (m.qkv_bias && !m.block_configs.empty()) {
    refuse("model.block_configs", "set with model.qkv_bias", "llama.cpp's `deci` has no q/k/v biases");
  }
  const config::MoeConfig& moe = m.moe;
  if (arch == "qwen2moe") {
    // llama.cpp's `qwen2moe`: a softmax over every expert, the k best weights as they are, and
    // a shared expert scaled by sigmoid(shared_expert_gate . x).
    const std::string qwen = "llama.cpp's `qwen2moe` routes as Qwen2-MoE without norm_topk_prob";
    if (moe.router != config::MoeRouter::SoftmaxTopk)
      refuse("model.moe_router", config::to_string(moe.router), qwen + " (softmax_topk)");
    if (moe.topk_scaling != 1.0) refuse("model.moe_topk_scaling", std::to_string(moe.topk_scaling), qwen + " (1)");
    if (moe.expert_bias) refuse("model.moe_expert_bias", "true", qwen + ", without a bias on the selection");
    if (moe.shared_ffn_size == 0 || !moe.shared_expert_gate)
      refuse("model.moe_shared_ffn_size and model.moe_shared_expert_gate", "not both set",
             qwen + ", with a gated shared expert");
    if (moe.latent_size > 0) {
      refuse("model.moe_latent_size", std::to_string(moe.latent_size), qwen + ", its experts at d_model");
    }
  } else if (moe.experts > 0 && m.block_configs.empty()) {
    // llama.cpp's `llama` MoE: every layer's, routed by a softmax over the k best logits (its
    // softmax over all, renormalised over the k), each expert a SwiGLU MLP, nothing else.
    const std::string mixtral = "llama.cpp's `llama` mixture of experts routes as Mixtral does";
    if (moe.router != config::MoeRouter::TopkSoftmax)
      refuse("model.moe_router", config::to_string(moe.router), mixtral + " (topk_softmax)");
    if (moe.topk_scaling != 1.0) refuse("model.moe_topk_scaling", std::to_string(moe.topk_scaling), mixtral + " (1)");
    if (moe.expert_bias) refuse("model.moe_expert_bias", "true", mixtral + ", without a bias on the selection");
    if (moe.shared_ffn_size > 0) {
      refuse("model.moe_shared_ffn_size", std::to_string(moe.shared_ffn_size), mixtral + ", without a shared expert");
    }
    if (moe.latent_size > 0) {
      refuse("model.moe_latent_size", std::to_string(moe.latent_size), mixtral + ", its experts at d_model");
    }
  }
  for (size_t l = 0; l < layers.size(); ++l) {
    const model::LayerSpec& spec = layers[l];
    const std::string block = "model.block_configs[" + std::to_string(l) + "]";
    if (spec.moe && !m.block_configs.empty()) {
      refuse(block + ".ffn", "moe", "llama.cpp's `deci` has dense MLPs only (a mixture of experts is exported in "
                                    "every layer or none, as llama.cpp's `llama`)");
    }
    if (l == 0 && !spec.has_attention) {
      refuse(block + ".attention", "skip", "llama.cpp takes the head size from the first layer's heads");
    }
    if (spec.has_attention && !spec.has_mlp()) {
      refuse(block + ".ffn_size", "0 with attention",
             "llama.cpp's `deci` graph passes over a layer without an MLP whole, its attention included");
    }
  }
}

// What every export says first: its name, alignment and matrices' dtype.
void add_general(GgufWriter& w, const std::string& dtype, const std::string& name) {
  w.add_string("general.name", name);
  w.add_u32("general.alignment", 32);
  w.add_u32("general.file_type", dtype == "f32" ? 0 : dtype == "f16" ? 1 : 32);
}

// llama.cpp's `llama`, `qwen2` or `qwen2moe` for a model whose layers are alike, `deci` for
// model.block_configs: the same keys under that prefix, with a value per layer where the layers
// differ (0 heads: no attention; 0 ffn: no MLP).
void add_metadata(GgufWriter& w, const config::ModelConfig& m, const std::vector<model::LayerSpec>& layers) {
  const std::string arch = transformer_arch(m);
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".context_length", m.max_seq_len);
  w.add_u32(arch + ".embedding_length", m.d_model);
  w.add_u32(arch + ".block_count", m.layers);
  if (arch != "deci") {
    const bool moe = m.moe.experts > 0;
    const int expert_ffn = m.moe.ffn_size > 0 ? m.moe.ffn_size : m.ffn_size;
    // llama's experts take feed_forward_length; qwen2moe's their own key, beside the shared one's.
    w.add_u32(arch + ".feed_forward_length", moe && arch == "llama" ? expert_ffn : m.ffn_size);
    w.add_u32(arch + ".attention.head_count", m.heads);
    w.add_u32(arch + ".attention.head_count_kv", m.kv_heads == 0 ? m.heads : m.kv_heads);
    if (moe) {
      w.add_u32(arch + ".expert_count", m.moe.experts);
      w.add_u32(arch + ".expert_used_count", m.moe.top_k);
    }
    if (arch == "qwen2moe") {
      w.add_u32("qwen2moe.expert_feed_forward_length", expert_ffn);
      w.add_u32("qwen2moe.expert_shared_feed_forward_length", m.moe.shared_ffn_size);
    }
  } else {
    std::vector<int32_t> ffn, heads, kv_heads;
    for (const model::LayerSpec& spec : layers) {
      ffn.push_back(spec.ffn_size);
      heads.push_back(spec.has_attention ? m.heads : 0);
      kv_heads.push_back(spec.has_attention ? spec.kv_heads : 0);
    }
    w.add_i32s("deci.feed_forward_length", ffn);
    w.add_i32s("deci.attention.head_count", heads);
    w.add_i32s("deci.attention.head_count_kv", kv_heads);
  }
  w.add_u32(arch + ".rope.dimension_count", model::head_dim(m));
  w.add_f32(arch + ".rope.freq_base", static_cast<float>(m.rope_theta));
  w.add_f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(m.norm_eps));
  w.add_u32(arch + ".vocab_size", m.vocab_size);
}

// Llama 3.1's scaled RoPE as llama.cpp takes it: a factor per rotated pair that its frequency
// is divided by (`rope_freqs.weight`), here each unscaled frequency over loom's scaled one.
std::vector<float> llama3_rope_factors(const config::ModelConfig& m) {
  const int64_t hd = model::head_dim(m);
  const std::vector<double> plain = kernels::rope_inverse_frequencies(hd, m.rope_theta, {});
  const std::vector<double> scaled = kernels::rope_inverse_frequencies(hd, m.rope_theta, model::rope_scaling(m));
  std::vector<float> factors;
  for (size_t i = 0; i < plain.size(); ++i) factors.push_back(static_cast<float>(plain[i] / scaled[i]));
  return factors;
}

std::vector<uint8_t> encode(const std::vector<float>& values, const std::string& dtype) {
  std::vector<uint8_t> out;
  if (dtype == "f32") {
    out.resize(values.size() * 4);
    std::memcpy(out.data(), values.data(), out.size());
    return out;
  }
  out.resize(values.size() * 2);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t bits = dtype == "f16" ? f32_to_f16(values[i]) : f32_to_bf16(values[i]);
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

// llama.cpp's rope (not NeoX) rotates adjacent pairs; loom's rotates (i, i + head_dim/2): within
// each head, output row 2i + j comes from row j * head_dim/2 + i.
std::vector<float> interleave_rope_rows(const std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const float* src = w.data() + (h * head_dim + j * half + i) * cols;
        std::copy(src, src + cols, out.data() + (h * head_dim + 2 * i + j) * cols);
      }
    }
  }
  return out;
}

// llama.cpp's `llama` (with or without experts), `qwen2`, `qwen2moe` and `deci` tensors of a loom
// checkpoint: q and k rows interleaved where its rope rotates adjacent pairs (all but the qwen2
// ones, whose NeoX rope rotates loom's halves), Llama 3.1's rope factors, each projection's experts
// stacked.
void put_llama_tensors(const ckpt::LoadedCheckpoint& checkpoint, const config::ModelConfig& m,
                       const std::vector<model::LayerSpec>& layers, const PutTensor& put) {
  const int64_t hd = model::head_dim(m);
  const std::string arch = transformer_arch(m);
  const bool interleave = arch == "llama" || arch == "deci";
  auto read = [&](const std::string& loom_name, Shape& shape) {
    shape = checkpoint.shape(loom_name);
    std::vector<float> values(shape_numel(shape));
    checkpoint.read(loom_name, values.data(), DType::F32, shape);
    return values;
  };
  auto add = [&](const std::string& loom_name, const std::string& gguf_name, int64_t permute_heads) {
    Shape shape;
    std::vector<float> values = read(loom_name, shape);
    if (interleave && permute_heads > 0) {
      values = interleave_rope_rows(values, permute_heads, hd, shape.at(1));
    }
    put(gguf_name, shape, values);
  };
  // Every expert's projection of a layer as one [experts, rows, cols] tensor (llama.cpp's *_exps).
  auto add_experts = [&](const std::string& prefix, const std::string& projection, const std::string& gguf_name) {
    Shape shape;
    std::vector<float> stacked;
    for (int e = 0; e < m.moe.experts; ++e) {
      const std::vector<float> expert = read(prefix + ".experts." + std::to_string(e) + "." + projection, shape);
      stacked.insert(stacked.end(), expert.begin(), expert.end());
    }
    shape.insert(shape.begin(), m.moe.experts);
    put(gguf_name, shape, stacked);
  };
  add("model.embed_tokens.weight", "token_embd.weight", 0);
  if (m.rope_scaling == config::RopeScaling::Llama3) {
    const std::vector<float> factors = llama3_rope_factors(m);
    put("rope_freqs.weight", {static_cast<int64_t>(factors.size())}, factors);
  }
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l), b = "blk." + std::to_string(l);
    const model::LayerSpec& spec = layers[static_cast<size_t>(l)];
    if (spec.has_attention) {
      add(p + ".input_layernorm.weight", b + ".attn_norm.weight", 0);
      add(p + ".self_attn.q_proj.weight", b + ".attn_q.weight", m.heads);
      add(p + ".self_attn.k_proj.weight", b + ".attn_k.weight", spec.kv_heads);
      add(p + ".self_attn.v_proj.weight", b + ".attn_v.weight", 0);
      add(p + ".self_attn.o_proj.weight", b + ".attn_output.weight", 0);
      if (m.qkv_bias) {
        add(p + ".self_attn.q_proj.bias", b + ".attn_q.bias", 0);
        add(p + ".self_attn.k_proj.bias", b + ".attn_k.bias", 0);
        add(p + ".self_attn.v_proj.bias", b + ".attn_v.bias", 0);
      }
    }
    if (spec.moe) {
      add(p + ".post_attention_layernorm.weight", b + ".ffn_norm.weight", 0);
      add(p + ".mlp.gate.weight", b + ".ffn_gate_inp.weight", 0);  // the router, [experts, d_model]
      add_experts(p + ".mlp", "gate_proj.weight", b + ".ffn_gate_exps.weight");
      add_experts(p + ".mlp", "up_proj.weight", b + ".ffn_up_exps.weight");
      add_experts(p + ".mlp", "down_proj.weight", b + ".ffn_down_exps.weight");
      if (arch == "qwen2moe") {  // the shared expert and its gate, [1, d_model] as a vector
        Shape gate;
        const std::vector<float> values = read(p + ".mlp.shared_expert_gate.weight", gate);
        put(b + ".ffn_gate_inp_shexp.weight", {gate.back()}, values);
        add(p + ".mlp.shared_expert.gate_proj.weight", b + ".ffn_gate_shexp.weight", 0);
        add(p + ".mlp.shared_expert.up_proj.weight", b + ".ffn_up_shexp.weight", 0);
        add(p + ".mlp.shared_expert.down_proj.weight", b + ".ffn_down_shexp.weight", 0);
      }
    } else if (spec.has_mlp()) {
      add(p + ".post_attention_layernorm.weight", b + ".ffn_norm.weight", 0);
      add(p + ".mlp.gate_proj.weight", b + ".ffn_gate.weight", 0);
      add(p + ".mlp.up_proj.weight", b + ".ffn_up.weight", 0);
      add(p + ".mlp.down_proj.weight", b + ".ffn_down.weight", 0);
    }
  }
  add("model.norm.weight", "output_norm.weight", 0);
  // Tied: llama.cpp reuses token_embd, but for qwen2moe, which needs an output of its own.
  if (!m.tied_embeddings) add("lm_head.weight", "output.weight", 0);
  if (m.tied_embeddings && arch == "qwen2moe") add("model.embed_tokens.weight", "output.weight", 0);
}

}  // namespace

GgufExportResult export_to_gguf(const std::string& checkpoint_path, const std::string& path, const GgufExportOptions& options) {
  LOOM_CHECK(options.dtype == "f32" || options.dtype == "f16" || options.dtype == "bf16",
             "--dtype: '" + options.dtype + "' is not one of f32, f16, bf16");
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config::RunConfig config = config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  const config::ModelConfig m = train::resolve_model_config(config.model, *tokenizer);
  const std::vector<model::LayerSpec> layers = model::resolve_layers(m);
  GgufWriter w;
  add_general(w, options.dtype, config.run.name);
  if (is_hybrid(m)) {
    try {
      hf::check_nemotron_h_exportable(m);
    } catch (const Error& e) {  // llama.cpp converts Hugging Face's NemotronH: what it cannot hold
      throw Error(std::string("loom convert --to-gguf: llama.cpp's nemotron_h runs Hugging Face's NemotronH: ") +
                  e.what());
    }
    check_nemotron_h_layers(m);
    add_nemotron_h_metadata(w, m);
  } else {
    check_exportable(m, layers);
    add_metadata(w, m, layers);
  }
  add_tokenizer(w, m.vocab_size, config.data.tokenizer, *tokenizer);
  GgufExportResult result{checkpoint.path(), checkpoint.step(), 0, 0, is_hybrid(m) ? "nemotron_h" : transformer_arch(m),
                          ""};
  if (m.mtp_depths > 0) {
    result.note = "model.mtp_depths = " + std::to_string(m.mtp_depths) +
                  ": the multi-token prediction depths are not exported (the file decodes without drafts)";
  }
  auto put = [&](const std::string& gguf_name, const Shape& shape, const std::vector<float>& values) {
    std::vector<uint64_t> dims(shape.rbegin(), shape.rend());  // ggml: fastest-varying first
    const std::string dtype = stays_f32(gguf_name, shape) ? "f32" : options.dtype;
    const TensorType type = dtype == "f32" ? TensorType::F32 : dtype == "f16" ? TensorType::F16 : TensorType::BF16;
    w.add_tensor(gguf_name, dims, type, encode(values, dtype));
    ++result.tensors;
  };
  if (is_hybrid(m)) {
    put_nemotron_h_tensors(checkpoint, m, put);
  } else {
    put_llama_tensors(checkpoint, m, layers, put);
  }
  result.bytes = w.write(path);
  return result;
}

}  // namespace loom::interop::gguf
