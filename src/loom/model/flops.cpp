#include "loom/model/flops.h"

#include <algorithm>

#include "loom/config/hybrid_config.h"
#include "loom/model/multi_token_prediction.h"

namespace loom::model {

namespace {

// A Mamba-2 mixer's forward per token: the projections, the convolution, and the chunked scan.
double mamba_forward_flops_per_token(const config::ModelConfig& config, int64_t seq) {
  const config::MambaConfig& m = config.mamba;
  const int64_t heads = config::mamba_heads(config);
  const double C = config.d_model, inner = static_cast<double>(heads) * m.head_dim,
               channels = inner + 2.0 * m.groups * m.state_size;
  const double projections = 2.0 * C * (inner + channels + heads) + 2.0 * inner * C;
  return projections + 2.0 * m.conv_kernel * channels +
         ssd_scan_forward_flops_per_token(heads, m.head_dim, m.groups, m.state_size, m.chunk_size, seq);
}

// A (gated or plain) MLP's forward per token, `width` in and out, `ffn` features.
double mlp_forward_flops_per_token(const config::ModelConfig& config, double width, double ffn) {
  const double in_width = config.activation == config::Activation::Swiglu ? 2.0 * ffn : ffn;
  return 2.0 * width * in_width + 2.0 * ffn * width;
}

}  // namespace

double ssd_scan_forward_flops_per_token(int64_t heads, int64_t head_dim, int64_t groups, int64_t state, int64_t chunk,
                                        int64_t seq) {
  const double H = static_cast<double>(heads), P = static_cast<double>(head_dim), N = static_cast<double>(state),
               G = static_cast<double>(groups);
  const double prefix = (static_cast<double>(std::min(chunk, seq)) + 1.0) / 2.0;
  return 2.0 * G * N * prefix + 2.0 * H * P * prefix + 4.0 * H * P * N;
}

double ssd_scan_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq) {
  if (!spec.has_mamba) return 0.0;
  const config::MambaConfig& m = config.mamba;
  return 3.0 * ssd_scan_forward_flops_per_token(config::mamba_heads(config), m.head_dim, m.groups, m.state_size,
                                                m.chunk_size, seq);
}

MoeTrainingFlops moe_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec) {
  MoeTrainingFlops f;
  if (!spec.moe) return f;
  // Active parameters only: top_k routed experts, not all of them.
  const config::MoeConfig& moe = config.moe;
  const double C = config.d_model, width = moe.latent_size > 0 ? moe.latent_size : C;
  const double ffn = moe.ffn_size > 0 ? moe.ffn_size : spec.ffn_size;
  f.router = 3.0 * 2.0 * C * moe.experts;
  f.latent = moe.latent_size > 0 ? 3.0 * 2.0 * 2.0 * C * width : 0.0;
  f.experts = 3.0 * moe.top_k * mlp_forward_flops_per_token(config, width, ffn);
  f.shared = moe.shared_ffn_size > 0 ? 3.0 * mlp_forward_flops_per_token(config, C, moe.shared_ffn_size) : 0.0;
  f.shared_gate = moe.shared_ffn_size > 0 && moe.shared_expert_gate ? 3.0 * 2.0 * C : 0.0;
  return f;
}

double layer_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq) {
  const double C = config.d_model, hd = head_dim(config), H = config.heads;
  double forward = 0.0;
  if (spec.has_attention) forward += 2.0 * C * (H + 2.0 * spec.kv_heads) * hd + 2.0 * H * hd * C;
  if (spec.has_mamba) forward += mamba_forward_flops_per_token(config, seq);
  if (!spec.moe && spec.has_mlp()) forward += mlp_forward_flops_per_token(config, C, spec.ffn_size);
  return 3.0 * forward + moe_training_flops_per_token(config, spec).total() +
         attention_training_flops_per_token(config, spec, seq);
}

double attention_training_flops_per_token(const config::ModelConfig& config, const LayerSpec& spec, int64_t seq) {
  if (!spec.has_attention) return 0.0;
  // Scores and weighted values over the causal prefix: (seq + 1) / 2 keys on average.
  return 3.0 * 2.0 * 2.0 * config.heads * head_dim(config) * (static_cast<double>(seq) + 1.0) / 2.0;
}

double head_training_flops_per_token(const config::ModelConfig& config, int64_t seq) {
  const double C = config.d_model, head = 3.0 * 2.0 * C * static_cast<double>(config.vocab_size);
  const double depth = head + 3.0 * 2.0 * (2.0 * C) * C + layer_training_flops_per_token(config, mtp_block_spec(config), seq);
  return head + config.mtp_depths * depth;
}

}  // namespace loom::model
