#include "loom/interop/gguf/gguf_export.h"

#include <cstring>
#include <vector>

#include "loom/ckpt/checkpoint.h"
#include "loom/config/run_config.h"
#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/data/tokenizer.h"
#include "loom/interop/gguf/gguf_tokenizer.h"
#include "loom/interop/gguf/gguf_writer.h"
#include "loom/model/layer_spec.h"
#include "loom/train/model_setup.h"

namespace loom::interop::gguf {

namespace {
void check_llama_style(const config::ModelConfig& m) {
  auto refuse = [](const std::string& key, const std::string& value) {
    throw Error("loom convert --to-gguf: " + key + " is " + value +
                "; the GGUF export writes llama.cpp's `llama` architecture (model.norm rms, model.activation swiglu, "
                "model.positions rope, model.bias and model.qkv_bias false, model.rope_scaling none, no model.block_configs)");
  };
  if (m.norm != config::Norm::Rms) refuse("model.norm", "layer");
  if (m.activation != config::Activation::Swiglu) refuse("model.activation", "gelu");
  if (m.positions != config::Positions::Rope) refuse("model.positions", "learned");
  if (m.bias) refuse("model.bias", "true");
  if (m.qkv_bias) refuse("model.qkv_bias", "true");
  if (m.rope_scaling != config::RopeScaling::None) refuse("model.rope_scaling", config::to_string(m.rope_scaling));
  if (!m.block_configs.empty()) refuse("model.block_configs", "set (heterogeneous layers)");
}

void add_metadata(GgufWriter& w, const config::ModelConfig& m, const std::string& dtype, const std::string& name) {
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", name);
  w.add_u32("general.alignment", 32);
  w.add_u32("general.file_type", dtype == "f32" ? 0 : dtype == "f16" ? 1 : 32);
  w.add_u32("llama.context_length", m.max_seq_len);
  w.add_u32("llama.embedding_length", m.d_model);
  w.add_u32("llama.block_count", m.layers);
  w.add_u32("llama.feed_forward_length", m.ffn_size);
  w.add_u32("llama.attention.head_count", m.heads);
  w.add_u32("llama.attention.head_count_kv", m.kv_heads == 0 ? m.heads : m.kv_heads);
  w.add_u32("llama.rope.dimension_count", model::head_dim(m));
  w.add_f32("llama.rope.freq_base", static_cast<float>(m.rope_theta));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(m.norm_eps));
  w.add_u32("llama.vocab_size", m.vocab_size);
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
}  // namespace

GgufExportResult export_to_gguf(const std::string& checkpoint_path, const std::string& path, const GgufExportOptions& options) {
  LOOM_CHECK(options.dtype == "f32" || options.dtype == "f16" || options.dtype == "bf16",
             "--dtype: '" + options.dtype + "' is not one of f32, f16, bf16");
  ckpt::LoadedCheckpoint checkpoint = ckpt::load_checkpoint(checkpoint_path);
  config::RunConfig config = config::parse_config(checkpoint.config_yaml(), checkpoint.path() + "/manifest.json", {});
  auto tokenizer = data::make_tokenizer(config.data.tokenizer);
  const config::ModelConfig m = train::resolve_model_config(config.model, *tokenizer);
  check_llama_style(m);
  GgufWriter w;
  add_metadata(w, m, options.dtype, config.run.name);
  add_tokenizer(w, m.vocab_size, config.data.tokenizer, *tokenizer);
  const int64_t hd = model::head_dim(m), kv_heads = m.kv_heads == 0 ? m.heads : m.kv_heads;
  GgufExportResult result{checkpoint.path(), checkpoint.step(), 0, 0};
  auto add = [&](const std::string& loom_name, const std::string& gguf_name, int64_t permute_heads) {
    const Shape shape = checkpoint.shape(loom_name);
    std::vector<float> values(shape_numel(shape));
    checkpoint.read(loom_name, values.data(), DType::F32, shape);
    if (permute_heads > 0) values = interleave_rope_rows(values, permute_heads, hd, shape.at(1));
    std::vector<uint64_t> dims(shape.rbegin(), shape.rend());  // ggml: fastest-varying first
    const std::string dtype = shape.size() == 1 ? "f32" : options.dtype;
    const TensorType type = dtype == "f32" ? TensorType::F32 : dtype == "f16" ? TensorType::F16 : TensorType::BF16;
    w.add_tensor(gguf_name, dims, type, encode(values, dtype));
    ++result.tensors;
  };
  add("model.embed_tokens.weight", "token_embd.weight", 0);
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l), b = "blk." + std::to_string(l);
    add(p + ".input_layernorm.weight", b + ".attn_norm.weight", 0);
    add(p + ".self_attn.q_proj.weight", b + ".attn_q.weight", m.heads);
    add(p + ".self_attn.k_proj.weight", b + ".attn_k.weight", kv_heads);
    add(p + ".self_attn.v_proj.weight", b + ".attn_v.weight", 0);
    add(p + ".self_attn.o_proj.weight", b + ".attn_output.weight", 0);
    add(p + ".post_attention_layernorm.weight", b + ".ffn_norm.weight", 0);
    add(p + ".mlp.gate_proj.weight", b + ".ffn_gate.weight", 0);
    add(p + ".mlp.up_proj.weight", b + ".ffn_up.weight", 0);
    add(p + ".mlp.down_proj.weight", b + ".ffn_down.weight", 0);
  }
  add("model.norm.weight", "output_norm.weight", 0);
  if (!m.tied_embeddings) add("lm_head.weight", "output.weight", 0);  // tied: llama.cpp reuses token_embd
  result.bytes = w.write(path);
  return result;
}

}  // namespace loom::interop::gguf
