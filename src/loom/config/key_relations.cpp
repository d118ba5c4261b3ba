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

// A dataset is named by data.<kind>_prefix or data.<kind>_blend, not both; a blend names each
// dataset once.
void check_dataset_keys(const std::string& kind, const std::string& prefix, const std::vector<BlendEntry>& blend) {
  LOOM_CHECK(prefix.empty() || blend.empty(),
             "data." + kind + "_prefix and data." + kind + "_blend are both set: give one (a single dataset, or a "
             "weighted blend of datasets)");
  for (size_t i = 0; i < blend.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      LOOM_CHECK(blend[i].prefix != blend[j].prefix,
                 "data." + kind + "_blend[" + std::to_string(i) + "].prefix = '" + blend[i].prefix +
                     "' is invalid: data." + kind + "_blend[" + std::to_string(j) +
                     "] names it already (give each dataset once, with the sum of its weights)");
    }
  }
}

// The learning-rate schedule's step counts (optim/schedule.h).
void check_schedule(const OptimConfig& o, int train_steps) {
  const std::string decay_end = o.decay_steps > 0 ? "optim.decay_steps = " + std::to_string(o.decay_steps)
                                                  : "train.steps = " + std::to_string(train_steps);
  const bool decays = o.schedule != LrSchedule::Constant;
  LOOM_CHECK(o.decay_steps == 0 || !decays || o.decay_steps > o.warmup_steps,
             "optim.decay_steps = " + std::to_string(o.decay_steps) +
                 " is invalid: must be 0 (= train.steps) or greater than optim.warmup_steps = " +
                 std::to_string(o.warmup_steps));
  if (o.schedule != LrSchedule::Wsd) {
    LOOM_CHECK(o.wsd_decay_steps == 0, "optim.wsd_decay_steps = " + std::to_string(o.wsd_decay_steps) +
                                           " is set but optim.schedule is '" + std::string(name_of(o.schedule)) +
                                           "': it is the annealing of schedule 'wsd'");
    return;
  }
  const int end = o.decay_steps > 0 ? o.decay_steps : train_steps;
  LOOM_CHECK(o.wsd_decay_steps > 0,
             "optim.schedule = 'wsd' needs optim.wsd_decay_steps: the annealing's steps at the end of the decay "
             "(>= 1)");
  const int most = end - o.warmup_steps;
  const std::string room = most >= 1 ? "so it must be in [1, " + std::to_string(most) + "]"
                                     : "which leaves it no step (lower optim.warmup_steps)";
  LOOM_CHECK(o.wsd_decay_steps <= most,
             "optim.wsd_decay_steps = " + std::to_string(o.wsd_decay_steps) + " is invalid: the annealing ends at " +
                 decay_end + " and cannot start before the warm-up's end (optim.warmup_steps = " +
                 std::to_string(o.warmup_steps) + "), " + room);
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
  check_dataset_keys("train", c.data.train_prefix, c.data.train_blend);
  check_dataset_keys("val", c.data.val_prefix, c.data.val_blend);
  check_schedule(c.optim, c.train.steps);
  LOOM_CHECK(c.optim.min_lr <= c.optim.lr, "optim.min_lr = " + format_double(c.optim.min_lr) +
                                          " is invalid: must be in [0, optim.lr = " + format_double(c.optim.lr) + "]");
  LOOM_CHECK(c.train.global_batch % c.train.micro_batch == 0,
        "train.global_batch = " + std::to_string(c.train.global_batch) +
            " is invalid: must be a multiple of train.micro_batch = " + std::to_string(c.train.micro_batch));
}

}  // namespace loom::config
