#include "loom/interop/gguf/gguf_nemotron_h.h"

#include <cmath>
#include <map>
#include <utility>

#include "loom/config/hybrid_config.h"
#include "loom/core/error.h"
#include "loom/interop/hf/hf_tensor_map.h"
#include "loom/model/layer_spec.h"

namespace loom::interop::gguf {

namespace {

// Hugging Face's names within a layer (backbone.layers.N.<rest>) as llama.cpp's (blk.N.<name>).
const std::map<std::string, std::string>& layer_names() {
  static const std::map<std::string, std::string> names = {
      {"norm.weight", "attn_norm.weight"},
      {"mixer.in_proj.weight", "ssm_in.weight"},
      {"mixer.conv1d.weight", "ssm_conv1d.weight"},
      {"mixer.conv1d.bias", "ssm_conv1d.bias"},
      {"mixer.dt_bias", "ssm_dt.bias"},
      {"mixer.A_log", "ssm_a"},
      {"mixer.D", "ssm_d"},
      {"mixer.norm.weight", "ssm_norm.weight"},
      {"mixer.out_proj.weight", "ssm_out.weight"},
      {"mixer.q_proj.weight", "attn_q.weight"},
      {"mixer.k_proj.weight", "attn_k.weight"},
      {"mixer.v_proj.weight", "attn_v.weight"},
      {"mixer.o_proj.weight", "attn_output.weight"},
      {"mixer.up_proj.weight", "ffn_up.weight"},
      {"mixer.down_proj.weight", "ffn_down.weight"},
      {"mixer.gate.weight", "ffn_gate_inp.weight"},
      {"mixer.gate.e_score_correction_bias", "exp_probs_b.bias"},
      {"mixer.shared_experts.up_proj.weight", "ffn_up_shexp.weight"},
      {"mixer.shared_experts.down_proj.weight", "ffn_down_shexp.weight"},
      {"mixer.fc1_latent_proj.weight", "ffn_latent_down.weight"},
      {"mixer.fc2_latent_proj.weight", "ffn_latent_up.weight"},
  };
  return names;
}

}  // namespace

void check_nemotron_h_layers(const config::ModelConfig& m) {
  const bool mlp = m.layer_pattern.find(config::kMlpLayer) != std::string::npos;
  const bool moe = m.layer_pattern.find(config::kMoeLayer) != std::string::npos;
  LOOM_CHECK(!(mlp && moe), "loom convert --to-gguf: model.layer_pattern is '" + m.layer_pattern +
                                "'; llama.cpp's nemotron_h takes every feed-forward layer of a model with experts for a "
                                "MoE layer: MLP ('-') and MoE ('E') layers cannot be mixed");
}

bool stays_f32(const std::string& name, const Shape& shape) {
  return shape.size() == 1 || name.ends_with(".ssm_a") || name.ends_with(".ssm_d") ||
         name.ends_with(".ssm_conv1d.weight") || name.ends_with(".ssm_norm.weight");
}

void add_nemotron_h_metadata(GgufWriter& w, const config::ModelConfig& m) {
  const std::string a = "nemotron_h";
  w.add_string("general.architecture", a);
  w.add_u32(a + ".context_length", m.max_seq_len);
  w.add_u32(a + ".embedding_length", m.d_model);
  w.add_u32(a + ".block_count", m.layers);
  w.add_u32(a + ".vocab_size", m.vocab_size);
  const int kv_heads = m.kv_heads == 0 ? m.heads : m.kv_heads;
  const int expert_ffn = m.moe.ffn_size > 0 ? m.moe.ffn_size : m.ffn_size;
  std::vector<int32_t> ffn, kv;
  for (const char kind : m.layer_pattern) {
    ffn.push_back(kind == config::kMlpLayer ? m.ffn_size : kind == config::kMoeLayer ? expert_ffn : 0);
    kv.push_back(kind == config::kAttentionLayer ? kv_heads : 0);
  }
  w.add_i32s(a + ".feed_forward_length", ffn);
  w.add_u32(a + ".attention.head_count", m.heads);
  w.add_i32s(a + ".attention.head_count_kv", kv);
  w.add_u32(a + ".attention.key_length", model::head_dim(m));
  w.add_u32(a + ".attention.value_length", model::head_dim(m));
  w.add_f32(a + ".attention.layer_norm_epsilon", static_cast<float>(m.norm_eps));
  w.add_f32(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(m.norm_eps));
  const int heads = config::mamba_heads(m);
  w.add_u32(a + ".ssm.conv_kernel", m.mamba.conv_kernel);
  w.add_u32(a + ".ssm.inner_size", heads * m.mamba.head_dim);
  w.add_u32(a + ".ssm.state_size", m.mamba.state_size);
  w.add_u32(a + ".ssm.time_step_rank", heads);
  w.add_u32(a + ".ssm.group_count", m.mamba.groups);
  if (m.moe.experts == 0) return;
  // Routed by sigmoid scores (plus the correction bias for the choice), the k weights normalised
  // and scaled, each expert up -> relu^2 -> down in the latent width, beside one shared expert.
  w.add_u32(a + ".expert_count", m.moe.experts);
  w.add_u32(a + ".expert_used_count", m.moe.top_k);
  w.add_u32(a + ".expert_feed_forward_length", expert_ffn);
  w.add_u32(a + ".expert_shared_feed_forward_length", m.moe.shared_ffn_size);
  w.add_u32(a + ".expert_shared_count", 1);
  w.add_bool(a + ".expert_weights_norm", true);
  w.add_f32(a + ".expert_weights_scale", static_cast<float>(m.moe.topk_scaling));
  if (m.moe.latent_size > 0) w.add_u32(a + ".moe_latent_size", m.moe.latent_size);
}

void put_nemotron_h_tensors(const ckpt::LoadedCheckpoint& checkpoint, const config::ModelConfig& m,
                            const PutTensor& put) {
  const int64_t groups = m.mamba.groups;
  // A layer's experts' up or down projections, gathered to go out as one [experts, rows, cols].
  std::map<std::string, std::pair<Shape, std::vector<float>>> stacks;
  auto flush_stacks = [&] {
    for (auto& [name, stack] : stacks) {
      Shape shape = stack.first;
      shape.insert(shape.begin(), m.moe.experts);
      put(name, shape, stack.second);
    }
    stacks.clear();
  };
  for (const hf::HfTensor& t : hf::hf_tensors(m)) {
    if (t.name.starts_with("mtp.")) continue;  // llama.cpp's draft head is not exported
    std::vector<float> values = hf::read_hf_tensor(checkpoint, t);
    if (t.name == "backbone.embeddings.weight") {
      put("token_embd.weight", t.shape, values);
      continue;
    }
    if (t.name == "backbone.norm_f.weight" || t.name == "lm_head.weight") {
      flush_stacks();
      put(t.name == "lm_head.weight" ? "output.weight" : "output_norm.weight", t.shape, values);
      continue;
    }
    const std::string layers = "backbone.layers.";
    LOOM_CHECK(t.name.starts_with(layers), "loom convert --to-gguf: no llama.cpp name for " + t.name);
    const size_t dot = t.name.find('.', layers.size());
    const std::string blk = "blk." + t.name.substr(layers.size(), dot - layers.size()) + ".";
    const std::string rest = t.name.substr(dot + 1);
    if (rest.starts_with("mixer.experts.")) {  // mixer.experts.E.{up,down}_proj.weight
      const std::string projection = rest.substr(rest.find('.', std::string("mixer.experts.").size()) + 1);
      auto& [shape, stacked] = stacks[blk + (projection == "up_proj.weight" ? "ffn_up_exps.weight" : "ffn_down_exps.weight")];
      shape = t.shape;
      stacked.insert(stacked.end(), values.begin(), values.end());
      continue;
    }
    flush_stacks();  // a layer's experts end where its next tensor begins
    const auto name = layer_names().find(rest);
    LOOM_CHECK(name != layer_names().end(), "loom convert --to-gguf: no llama.cpp name for " + t.name);
    Shape shape = t.shape;
    if (rest == "mixer.A_log") {
      for (float& v : values) v = -std::exp(v);  // llama.cpp's scan takes A itself
      shape = {t.shape[0], 1};
    } else if (rest == "mixer.D") {
      shape = {t.shape[0], 1};
    } else if (rest == "mixer.conv1d.weight") {
      shape = {t.shape[0], t.shape[2]};  // [channels, 1, kernel] -> [channels, kernel]
    } else if (rest == "mixer.norm.weight") {
      shape = {groups, t.shape[0] / groups};  // the gated norm normalises each group on its own
    }
    put(blk + name->second, shape, values);
  }
  flush_stacks();
}

}  // namespace loom::interop::gguf
