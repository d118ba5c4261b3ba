#include "loom/config/key_relations.h"

#include <string>
#include <utility>
#include <vector>

#include "loom/config/grpo_schema.h"
#include "loom/config/hybrid_config.h"
#include "loom/config/rampup_value.h"
#include "loom/config/split_value.h"
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

// data.split takes the validation and test sets from the training datasets: no other is named.
void check_split(const DataConfig& d) {
  if (!d.split.on()) return;
  const std::string split = "data.split = " + detail::Value<DataSplit>::show(d.split);
  for (const auto& [key, named] : {std::pair{"data.val_prefix", !d.val_prefix.empty()},
                                   std::pair{"data.val_blend", !d.val_blend.empty()},
                                   std::pair{"data.test_prefix", !d.test_prefix.empty()},
                                   std::pair{"data.test_blend", !d.test_blend.empty()}}) {
    LOOM_CHECK(!named, split + " takes the validation and test sets from the training datasets, and " + key +
                           " is set too: give one (the split, or separate datasets)");
  }
}

// The learning-rate schedule's lengths in one unit, "steps" or "samples" (optim/schedule.h): its
// keys are optim.warmup_<unit>, optim.decay_<unit>, optim.wsd_decay_<unit>, ending by default at
// train.<unit>.
struct ScheduleLengths {
  std::string unit;
  int64_t warmup = 0, decay = 0, wsd_decay = 0, total = 0;
};

void check_schedule(const OptimConfig& o, const ScheduleLengths& l) {
  const std::string warmup = "optim.warmup_" + l.unit + " = " + std::to_string(l.warmup);
  const std::string decay_key = "optim.decay_" + l.unit, wsd_key = "optim.wsd_decay_" + l.unit;
  const std::string decay_end = l.decay > 0 ? decay_key + " = " + std::to_string(l.decay)
                                            : "train." + l.unit + " = " + std::to_string(l.total);
  const bool decays = o.schedule != LrSchedule::Constant;
  LOOM_CHECK(l.decay == 0 || !decays || l.decay > l.warmup,
             decay_key + " = " + std::to_string(l.decay) + " is invalid: must be 0 (= train." + l.unit +
                 ") or greater than " + warmup);
  if (o.schedule != LrSchedule::Wsd) {
    LOOM_CHECK(l.wsd_decay == 0, wsd_key + " = " + std::to_string(l.wsd_decay) +
                                     " is set but optim.schedule is '" + std::string(name_of(o.schedule)) +
                                     "': it is the annealing of schedule 'wsd'");
    return;
  }
  const int64_t end = l.decay > 0 ? l.decay : l.total;
  LOOM_CHECK(l.wsd_decay > 0, "optim.schedule = 'wsd' needs " + wsd_key + ": the annealing's " + l.unit +
                                  " at the end of the decay (>= 1)");
  const int64_t most = end - l.warmup;
  const std::string room = most >= 1 ? "so it must be in [1, " + std::to_string(most) + "]"
                                     : "which leaves it no " + l.unit.substr(0, l.unit.size() - 1) +
                                           " (lower optim.warmup_" + l.unit + ")";
  LOOM_CHECK(l.wsd_decay <= most, wsd_key + " = " + std::to_string(l.wsd_decay) +
                                      " is invalid: the annealing ends at " + decay_end +
                                      " and cannot start before the warm-up's end (" + warmup + "), " + room);
}

// The schedule keys of the other unit are refused: `key` = `value` counts `unit`, which this run
// does not (`why`).
void refuse_other_unit(const std::string& key, int64_t value, const std::string& why, const std::string& instead) {
  LOOM_CHECK(value == 0, key + " = " + std::to_string(value) + " " + why + ": use " + instead + " (and set " + key +
                             "=0)");
}

// The run's length (train.steps or train.samples, Megatron's --train-iters / --train-samples) and
// its learning-rate schedule in the same unit.
void check_run_length(const TrainConfig& t, const OptimConfig& o) {
  if (t.samples == 0) {
    LOOM_CHECK(t.steps >= 1, "train.steps = 0 needs train.samples, the run's length in samples (or set train.steps "
                             ">= 1)");
    const std::string why = "counts samples, but this run is measured in steps (train.steps = " +
                            std::to_string(t.steps) + "; train.samples measures one in samples)";
    refuse_other_unit("optim.warmup_samples", o.warmup_samples, why, "optim.warmup_steps");
    refuse_other_unit("optim.decay_samples", o.decay_samples, why, "optim.decay_steps");
    refuse_other_unit("optim.wsd_decay_samples", o.wsd_decay_samples, why, "optim.wsd_decay_steps");
    check_schedule(o, {"steps", o.warmup_steps, o.decay_steps, o.wsd_decay_steps, t.steps});
    return;
  }
  const std::string samples = "train.samples = " + std::to_string(t.samples);
  LOOM_CHECK(t.steps == 0, samples + " and train.steps = " + std::to_string(t.steps) +
                               " both give the run's length: give one (train.steps=0 with train.samples)");
  const std::string why = "counts steps, but " + samples + " measures this run in samples";
  refuse_other_unit("optim.warmup_steps", o.warmup_steps, why, "optim.warmup_samples");
  refuse_other_unit("optim.decay_steps", o.decay_steps, why, "optim.decay_samples");
  refuse_other_unit("optim.wsd_decay_steps", o.wsd_decay_steps, why, "optim.wsd_decay_samples");
  LOOM_CHECK(t.rampup_batch_size.on() || t.samples >= t.global_batch,
             samples + " is less than one global batch (train.global_batch = " + std::to_string(t.global_batch) + ")");
  check_schedule(o, {"samples", o.warmup_samples, o.decay_samples, o.wsd_decay_samples, t.samples});
}

// The ramp-up's batches climb from its start to train.global_batch in whole increments.
void check_rampup(const TrainConfig& t) {
  const BatchRampup& r = t.rampup_batch_size;
  if (!r.on()) return;
  const std::string ramp = "train.rampup_batch_size = " + detail::Value<BatchRampup>::show(r);
  LOOM_CHECK(r.start < t.global_batch, ramp + " is invalid: its start batch must be below train.global_batch = " +
                                           std::to_string(t.global_batch) + ", the batch it ramps up to");
  LOOM_CHECK((t.global_batch - r.start) % r.increment == 0,
             ramp + " is invalid: its increment must divide train.global_batch - start = " +
                 std::to_string(t.global_batch - r.start) + " (the ramp ends on train.global_batch)");
}

// What is kept in host memory on a GPU run: the optimizer's state (optim.cpu_offload, a share of it
// with optim.offload_fraction), and ZeRO-3's shards with it (parallel.offload_params).
void check_offload(const RunConfig& c) {
  LOOM_CHECK(c.optim.cpu_offload || c.optim.offload_fraction == 1.0,
             "optim.offload_fraction is the share of the state optim.cpu_offload moves to the host: set "
             "optim.cpu_offload=true with it, or leave it at 1");
  LOOM_CHECK(!c.optim.cpu_offload || c.runtime.device == RuntimeDevice::Cuda,
             "optim.cpu_offload=true needs runtime.device=cuda: on the cpu the optimizer state is in host memory "
             "already (set optim.cpu_offload=false)");
  LOOM_CHECK(!c.parallel.offload_params_device_copy || c.parallel.offload_params,
             "parallel.offload_params_device_copy=true keeps a device copy of the parameter shards "
             "parallel.offload_params moves to the host: set parallel.offload_params=true with it (and "
             "parallel.zero=3, optim.cpu_offload=true)");
  if (!c.parallel.offload_params) return;
  LOOM_CHECK(c.parallel.zero == 3, "parallel.offload_params=true keeps ZeRO-3's parameter and gradient shards in host "
                                   "memory: set parallel.zero=3 (it is " + std::to_string(c.parallel.zero) + ")");
  LOOM_CHECK(c.optim.cpu_offload && c.optim.offload_fraction == 1.0,
             "parallel.offload_params=true updates the shards where they are, on the host: set optim.cpu_offload=true "
             "and leave optim.offload_fraction at 1");
}

// The update's parameter all-gathers exist at ZeRO 1-2 only: ZeRO-0 has none, and ZeRO-3 gathers
// each unit's parameters around its own forward, prefetching the next.
void check_overlap_param_gather(const RunConfig& c) {
  LOOM_CHECK(!c.parallel.overlap_param_gather || c.parallel.zero == 1 || c.parallel.zero == 2,
             "parallel.overlap_param_gather=true overlaps the distributed optimizer's parameter all-gathers with the "
             "next forward: set parallel.zero=1 or 2 (it is " + std::to_string(c.parallel.zero) +
                 (c.parallel.zero == 3 ? "; ZeRO-3 gathers each unit's parameters as it runs, the next one prefetched)"
                                       : "; ZeRO-0 gathers no parameters)"));
}

}  // namespace

void check_key_relations(const RunConfig& c) {
  check_offload(c);
  check_overlap_param_gather(c);
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
  check_dataset_keys("test", c.data.test_prefix, c.data.test_blend);
  check_split(c.data);
  LOOM_CHECK(c.sft.train_weights.empty() || c.sft.train_weights.size() == c.sft.train_files.size(),
             "sft.train_weights has " + std::to_string(c.sft.train_weights.size()) + " weights for " +
                 std::to_string(c.sft.train_files.size()) +
                 " sft.train_files entries: give one per entry (each its own dataset), or none (all pooled)");
  LOOM_CHECK(c.sft.val_files.empty() || c.sft.val_fraction == 0.0,
             "sft.val_files names the validation conversations, and sft.val_fraction = " +
                 format_double(c.sft.val_fraction) +
                 " holds some of sft.train_files out for validation too: set sft.val_fraction=0 with sft.val_files "
                 "(or give no sft.val_files)");
  check_run_length(c.train, c.optim);
  check_rampup(c.train);
  LOOM_CHECK(c.optim.min_lr <= c.optim.lr, "optim.min_lr = " + format_double(c.optim.min_lr) +
                                          " is invalid: must be in [0, optim.lr = " + format_double(c.optim.lr) + "]");
  LOOM_CHECK(c.train.global_batch % c.train.micro_batch == 0,
        "train.global_batch = " + std::to_string(c.train.global_batch) +
            " is invalid: must be a multiple of train.micro_batch = " + std::to_string(c.train.micro_batch));
}

}  // namespace loom::config
