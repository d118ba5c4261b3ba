#include "loom/config/key_relations.h"

#include <string>
#include <vector>

#include "loom/config/grpo_schema.h"
#include "loom/config/hybrid_config.h"
#include "loom/config/yaml_values.h"
#include "loom/core/error.h"

namespace loom::config {

namespace {

using detail::format_double;
using detail::join;

// The MoE keys that relate to each other (per-key ranges are in the schema).
void validate_moe(const ModelConfig& m) {
  const MoeConfig& e = m.moe;
  bool any = e.experts > 0;
  for (size_t i = 0; i < m.block_configs.size(); ++i) {
    const bool moe = m.block_configs[i].ffn == BlockFfn::Moe;
    LOOM_CHECK(!moe || e.experts > 0, "model.block_configs[" + std::to_string(i) +
                                          "].ffn = 'moe' needs model.moe_experts > 0 (the number of experts)");
    any = any || moe;
  }
  if (!any) return;
  LOOM_CHECK(!e.shared_expert_gate || e.shared_ffn_size > 0,
             "model.moe_shared_expert_gate = true needs a shared expert to gate (model.moe_shared_ffn_size > 0)");
  LOOM_CHECK(e.top_k <= e.experts, "model.moe_top_k = " + std::to_string(e.top_k) +
                                       " is invalid: must be in [1, model.moe_experts = " + std::to_string(e.experts) + "]");
  LOOM_CHECK(e.latent_size == 0 || e.latent_size <= m.d_model,
             "model.moe_latent_size = " + std::to_string(e.latent_size) +
                 " is invalid: must be 0 (experts at d_model) or in [1, model.d_model = " + std::to_string(m.d_model) + "]");
}

}  // namespace

void check_key_relations(const RunConfig& c) {
  LOOM_CHECK(c.profile.last_step == 0 || c.profile.first_step > 0,
             "profile.last_step = " + std::to_string(c.profile.last_step) +
                 " needs profile.first_step, the first step to trace (>= 1)");
  LOOM_CHECK(c.profile.last_step == 0 || c.profile.last_step >= c.profile.first_step,
             "profile.last_step = " + std::to_string(c.profile.last_step) + " is invalid: must be 0 (first_step alone) "
                 "or >= profile.first_step = " + std::to_string(c.profile.first_step));
  const ModelConfig& m = c.model;
  auto divisors = [](int n) {
    std::vector<std::string> out{"0"};
    for (int d = 1; d <= n; ++d)
      if (n % d == 0) out.push_back(std::to_string(d));
    return join(out);
  };
  LOOM_CHECK(m.kv_heads == 0 || m.heads % m.kv_heads == 0,
        "model.kv_heads = " + std::to_string(m.kv_heads) + " is invalid: must be 0 (= heads) or divide model.heads = " +
            std::to_string(m.heads) + " (valid: " + divisors(m.heads) + ")");
  LOOM_CHECK(m.d_model % m.heads == 0, "model.d_model = " + std::to_string(m.d_model) +
                                      " is invalid: must be a multiple of model.heads = " + std::to_string(m.heads));
  const int head_dim = m.d_model / m.heads;
  LOOM_CHECK(m.positions != Positions::Rope || head_dim % 2 == 0,
        "model.positions = 'rope' needs an even head dimension, but model.d_model / model.heads = " +
            std::to_string(m.d_model) + " / " + std::to_string(m.heads) + " = " + std::to_string(head_dim) +
            "; change d_model or heads, or use positions: learned");
  LOOM_CHECK(m.block_configs.empty() || m.block_configs.size() == static_cast<size_t>(m.layers),
        "model.block_configs has " + std::to_string(m.block_configs.size()) +
            (m.block_configs.size() == 1 ? " entry" : " entries") + "; it must be empty or have exactly model.layers = " + std::to_string(m.layers));
  for (size_t i = 0; i < m.block_configs.size(); ++i) {
    const int kv = m.block_configs[i].kv_heads;
    LOOM_CHECK(kv == 0 || m.heads % kv == 0,
          "model.block_configs[" + std::to_string(i) + "].kv_heads = " + std::to_string(kv) +
              " is invalid: must be 0 (= model.kv_heads) or divide model.heads = " + std::to_string(m.heads) +
              " (valid: " + divisors(m.heads) + ")");
  }
  LOOM_CHECK(m.rope_scaling != RopeScaling::Llama3 || m.rope_high_freq_factor > m.rope_low_freq_factor,
        "model.rope_high_freq_factor = " + format_double(m.rope_high_freq_factor) +
            " is invalid with model.rope_scaling = 'llama3': must be greater than model.rope_low_freq_factor = " +
            format_double(m.rope_low_freq_factor));
  LOOM_CHECK(m.rope_scaling != RopeScaling::Yarn || m.rope_beta_fast > m.rope_beta_slow,
        "model.rope_beta_fast = " + format_double(m.rope_beta_fast) +
            " is invalid with model.rope_scaling = 'yarn': must be greater than model.rope_beta_slow = " +
            format_double(m.rope_beta_slow));
  check_hybrid(m);
  check_hybrid_layout(c);
  check_grpo(c);
  validate_moe(m);
  LOOM_CHECK(c.data.seq_len <= m.max_seq_len,
        "data.seq_len = " + std::to_string(c.data.seq_len) + " is invalid: must be in [1, model.max_seq_len = " +
            std::to_string(m.max_seq_len) + "]");
  LOOM_CHECK(c.optim.min_lr <= c.optim.lr, "optim.min_lr = " + format_double(c.optim.min_lr) +
                                          " is invalid: must be in [0, optim.lr = " + format_double(c.optim.lr) + "]");
  LOOM_CHECK(c.train.global_batch % c.train.micro_batch == 0,
        "train.global_batch = " + std::to_string(c.train.global_batch) +
            " is invalid: must be a multiple of train.micro_batch = " + std::to_string(c.train.micro_batch));
}

}  // namespace loom::config
