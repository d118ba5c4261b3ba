#include "loom/config/run_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <system_error>

#include "loom/config/grpo_schema.h"
#include "loom/config/key_relations.h"
#include "loom/config/map_values.h"
#include "loom/config/rampup_value.h"
#include "loom/config/schema_keys.h"
#include "loom/config/split_value.h"
#include "loom/config/suggestion.h"
#include "loom/config/yaml_values.h"
#include "loom/core/atomic_file.h"
#include "loom/core/error.h"
#include "loom/core/tokenizer_names.h"

namespace loom::config {

namespace detail {

// sft.train_roles: chat roles, at least one.
Check<std::vector<std::string>> only_roles() {
  return [](const std::vector<std::string>& roles) -> std::optional<std::string> {
    const std::vector<std::string> valid = {"system", "user", "assistant", "tool"};
    if (roles.empty()) return std::string("must name at least one role of " + join(valid));
    for (const std::string& role : roles)
      if (std::find(valid.begin(), valid.end(), role) == valid.end())
        return in_quotes(role) + " is not a role; valid: " + join(valid) + suggestion(role, valid);
    return std::nullopt;
  };
}

// Rank numbers (profile.ranks): none negative; the world's size is checked when it is known.
Check<std::vector<int>> each_at_least(int low) {
  return [low](const std::vector<int>& values) -> std::optional<std::string> {
    for (const int value : values)
      if (value < low) return std::to_string(value) + " must be >= " + std::to_string(low);
    return std::nullopt;
  };
}

// Blend weights (sft.train_weights): each a finite number > 0.
Check<std::vector<double>> each_a_weight() {
  return [](const std::vector<double>& weights) -> std::optional<std::string> {
    for (const double w : weights)
      if (auto problem = weight_problem(w)) return "each weight " + *problem;
    return std::nullopt;
  };
}

// Each of train.rampup_batch_size's three numbers is at least 1 (the three relate to the batch
// sizes in key_relations.cpp).
Check<BatchRampup> rampup_numbers() {
  return [](const BatchRampup& r) -> std::optional<std::string> {
    if (r == BatchRampup{} || (r.start >= 1 && r.increment >= 1 && r.samples >= 1)) return std::nullopt;
    return std::string("must be [] (no ramp-up) or three integers >= 1: the start batch, its increment and the "
                       "samples the ramp-up lasts");
  };
}

// data.split: one to three shares (train, validation, test), each finite and at least 0, the
// train share above 0 (Megatron's parse_and_normalize_split, with a part to train on).
Check<DataSplit> split_shares() {
  return [](const DataSplit& split) -> std::optional<std::string> {
    if (!split.on()) return std::nullopt;
    if (split.shares.size() > 3)
      return "must be 1 to 3 shares (train, validation, test), not " + std::to_string(split.shares.size());
    for (const double share : split.shares) {
      if (!std::isfinite(share) || share < 0.0) return "must be shares >= 0, not " + format_double(share);
    }
    if (split.shares[0] <= 0.0) return std::string("must give training a share: the first (train) share above 0");
    return std::nullopt;
  };
}

// A tokenizer name (core/tokenizer_names.h) or hf:<dir>; the directory is read when the
// tokenizer is made, which names what is missing there.
Check<std::string> tokenizer_name() {
  return [](const std::string& value) -> std::optional<std::string> {
    if (is_valid_tokenizer_name(value)) return std::nullopt;
    std::vector<std::string> allowed = known_tokenizer_names();
    return "must be one of " + join(allowed) + ", or hf:<dir> (a Hugging Face tokenizer directory)" +
           suggestion(value, allowed);
  };
}


// Lifts a section's keys to keys of the whole RunConfig.
template <class Section>
Key<RunConfig> lift(Section RunConfig::*section, Key<Section> key) {
  Key<RunConfig> lifted;
  lifted.name = key.name;
  lifted.parse = [section, parse = key.parse](RunConfig& c, const YAML::Node& n, const Origin& o) { parse(c.*section, n, o); };
  lifted.emit = [section, emit = key.emit](const RunConfig& c, YAML::Emitter& out) { emit(c.*section, out); };
  lifted.check = [section, check = key.check](const RunConfig& c, const std::string& p) { check(c.*section, p); };
  return lifted;
}

// A key of model.moe (written flat in the model section as moe_<key>, as Megatron's flags).
template <class T>
Key<ModelConfig> moe_field(std::string name, T MoeConfig::*member, std::type_identity_t<Check<T>> check = nullptr) {
  Key<MoeConfig> key = field(std::move(name), member, std::move(check));
  Key<ModelConfig> lifted{key.name, nullptr, nullptr, nullptr};
  lifted.parse = [parse = key.parse](ModelConfig& m, const YAML::Node& n, const Origin& o) { parse(m.moe, n, o); };
  lifted.emit = [emit = key.emit](const ModelConfig& m, YAML::Emitter& out) { emit(m.moe, out); };
  lifted.check = [check = key.check](const ModelConfig& m, const std::string& p) { check(m.moe, p); };
  return lifted;
}

struct SectionSchema {
  std::string name;
  std::vector<Key<RunConfig>> keys;
};

template <class Section>
SectionSchema section(std::string name, Section RunConfig::*member, std::vector<Key<Section>> keys) {
  SectionSchema schema{std::move(name), {}};
  for (auto& key : keys) schema.keys.push_back(lift(member, std::move(key)));
  return schema;
}

// The schema: every section and key of a config, with its per-key range check. Checks that
// relate several keys live in validate_config. A new key is one line here.
const std::vector<SectionSchema>& schema() {
  static const std::vector<SectionSchema> sections = {
      section("run", &RunConfig::run,
              {
                  field("dir", &RunSection::dir),
                  field("name", &RunSection::name),
                  field("overwrite", &RunSection::overwrite),
              }),
      section("runtime", &RunConfig::runtime,
              {
                  field("backend", &RuntimeConfig::backend),
                  field("device", &RuntimeConfig::device),
                  field("device_comm", &RuntimeConfig::device_comm),
                  field("ranks", &RuntimeConfig::ranks,
                        in_range(1, kMaxThreadRanks, " (ranks of the threads backend are threads of one process; "
                                                     "more ranks run under mpirun or srun)")),
                  field("timeout_s", &RuntimeConfig::timeout_s, greater_than(0)),
              }),
      section("parallel", &RunConfig::parallel,
              {
                  field("dp", &ParallelConfig::dp),
                  field("tp", &ParallelConfig::tp, at_least(1)),
                  field("ep", &ParallelConfig::ep, at_least(1)),
                  field("sequence_parallel", &ParallelConfig::sequence_parallel),
                  field("cp", &ParallelConfig::cp, at_least(1)),
                  field("cp_comm", &ParallelConfig::cp_comm),
                  field("zero", &ParallelConfig::zero, at_least(0)),
                  field("offload_params", &ParallelConfig::offload_params),
                  field("offload_params_device_copy", &ParallelConfig::offload_params_device_copy),
                  field("overlap_param_gather", &ParallelConfig::overlap_param_gather),
                  field("overlap_tp_comm", &ParallelConfig::overlap_tp_comm),
                  field("bucket_mb", &ParallelConfig::bucket_mb, greater_than(0)),
                  field("pp", &ParallelConfig::pp, at_least(1)),
                  field("pipeline_schedule", &ParallelConfig::pipeline_schedule),
                  field("virtual_stages", &ParallelConfig::virtual_stages, at_least(1)),
                  field("pipeline_partition", &ParallelConfig::pipeline_partition),
                  field("dp_sites", &ParallelConfig::dp_sites, at_least(0)),
                  field("cross_site_reduce", &ParallelConfig::cross_site_reduce),
                  field("outer", &ParallelConfig::outer),
                  field("outer_steps", &ParallelConfig::outer_steps, at_least(1)),
                  field("outer_lr", &ParallelConfig::outer_lr, greater_than(0)),
                  field("outer_momentum", &ParallelConfig::outer_momentum, in_range(0.0, 0.999, std::string(" (1 would never forget)"))),
                  field("outer_fragments", &ParallelConfig::outer_fragments, at_least(1)),
              }),
      section("precision", &RunConfig::precision,
              {
                  field("recipe", &PrecisionConfig::recipe),
                  field("grad_reduce", &PrecisionConfig::grad_reduce),
                  field("param_dtype", &PrecisionConfig::param_dtype),
                  field("loss_scale_initial", &PrecisionConfig::loss_scale_initial, greater_than(0)),
                  field("loss_scale_growth_interval", &PrecisionConfig::loss_scale_growth_interval, at_least(1)),
                  field("loss_scale_min", &PrecisionConfig::loss_scale_min, greater_than(0)),
                  field("fp8_amax_history", &PrecisionConfig::fp8_amax_history, at_least(1)),
                  field("fp8_margin", &PrecisionConfig::fp8_margin, at_least(0)),
                  field("fp8_edge_layers_bf16", &PrecisionConfig::fp8_edge_layers_bf16),
                  field("fp8_forward_fast_accumulation", &PrecisionConfig::fp8_forward_fast_accumulation),
                  field("gelu_epilogue", &PrecisionConfig::gelu_epilogue),
                  field("fp8_weights_from_optimizer", &PrecisionConfig::fp8_weights_from_optimizer),
                  field("attention", &PrecisionConfig::attention),
              }),
      section("topology", &RunConfig::topology,
              {
                  field("ranks_per_node", &TopologyConfig::ranks_per_node, at_least(0)),
                  field("nodes_per_site", &TopologyConfig::nodes_per_site, at_least(0)),
                  field("node_latency_us", &TopologyConfig::node_latency_us, at_least(0.0)),
                  field("node_bandwidth_gbps", &TopologyConfig::node_bandwidth_gbps, at_least(0.0)),
                  field("site_latency_us", &TopologyConfig::site_latency_us, at_least(0.0)),
                  field("site_bandwidth_gbps", &TopologyConfig::site_bandwidth_gbps, at_least(0.0)),
                  field("cross_site_latency_us", &TopologyConfig::cross_site_latency_us, at_least(0.0)),
                  field("cross_site_bandwidth_gbps", &TopologyConfig::cross_site_bandwidth_gbps, at_least(0.0)),
                  field("simulate", &TopologyConfig::simulate),
              }),
      section("model", &RunConfig::model,
              {
                  field("vocab_size", &ModelConfig::vocab_size, at_least(0)),
                  field("d_model", &ModelConfig::d_model, at_least(1)),
                  field("layers", &ModelConfig::layers, at_least(1)),
                  field("heads", &ModelConfig::heads, at_least(1)),
                  field("kv_heads", &ModelConfig::kv_heads, at_least(0)),
                  field("ffn_size", &ModelConfig::ffn_size, at_least(1)),
                  field("norm", &ModelConfig::norm),
                  field("activation", &ModelConfig::activation),
                  field("positions", &ModelConfig::positions),
                  field("tied_embeddings", &ModelConfig::tied_embeddings),
                  field("bias", &ModelConfig::bias),
                  field("max_seq_len", &ModelConfig::max_seq_len, at_least(1)),
                  field("rope_theta", &ModelConfig::rope_theta, greater_than(0)),
                  field("rope_scaling", &ModelConfig::rope_scaling),
                  field("rope_scaling_factor", &ModelConfig::rope_scaling_factor, greater_than(0)),
                  field("rope_low_freq_factor", &ModelConfig::rope_low_freq_factor, greater_than(0)),
                  field("rope_high_freq_factor", &ModelConfig::rope_high_freq_factor, greater_than(0)),
                  field("rope_original_max_positions", &ModelConfig::rope_original_max_positions, at_least(1)),
                  field("rope_beta_fast", &ModelConfig::rope_beta_fast, greater_than(0)),
                  field("rope_beta_slow", &ModelConfig::rope_beta_slow, greater_than(0)),
                  field("qkv_bias", &ModelConfig::qkv_bias),
                  field("norm_eps", &ModelConfig::norm_eps, greater_than(0)),
                  field("init_std", &ModelConfig::init_std, greater_than(0)),
                  field("recompute", &ModelConfig::recompute),
                  field("block_configs", &ModelConfig::block_configs),
                  field("layer_pattern", &ModelConfig::layer_pattern),
                  field("mamba", &ModelConfig::mamba),
                  field("mtp_depths", &ModelConfig::mtp_depths, at_least(0)),
                  field("mtp_loss_weight", &ModelConfig::mtp_loss_weight, at_least(0.0)),
                  field("mtp_use_repeated_layer", &ModelConfig::mtp_use_repeated_layer),
                  moe_field("moe_experts", &MoeConfig::experts, at_least(0)),
                  moe_field("moe_top_k", &MoeConfig::top_k, at_least(1)),
                  moe_field("moe_ffn_size", &MoeConfig::ffn_size, at_least(0)),
                  moe_field("moe_shared_ffn_size", &MoeConfig::shared_ffn_size, at_least(0)),
                  moe_field("moe_shared_expert_gate", &MoeConfig::shared_expert_gate),
                  moe_field("moe_latent_size", &MoeConfig::latent_size, at_least(0)),
                  moe_field("moe_router", &MoeConfig::router),
                  moe_field("moe_topk_scaling", &MoeConfig::topk_scaling, greater_than(0)),
                  moe_field("moe_expert_bias", &MoeConfig::expert_bias),
                  moe_field("moe_bias_update_rate", &MoeConfig::bias_update_rate, at_least(0.0)),
                  moe_field("moe_router_lr_scale", &MoeConfig::router_lr_scale, greater_than(0)),
                  moe_field("moe_aux_loss", &MoeConfig::aux_loss),
                  moe_field("moe_aux_loss_coeff", &MoeConfig::aux_loss_coeff, at_least(0.0)),
                  moe_field("moe_z_loss_coeff", &MoeConfig::z_loss_coeff, at_least(0.0)),
                  moe_field("moe_capacity_factor", &MoeConfig::capacity_factor, at_least(0.0)),
                  moe_field("moe_drop_policy", &MoeConfig::drop_policy),
              }),
      section("data", &RunConfig::data,
              {
                  field("tokenizer", &DataConfig::tokenizer, tokenizer_name()),
                  field("train_prefix", &DataConfig::train_prefix),
                  field("val_prefix", &DataConfig::val_prefix),
                  field("train_blend", &DataConfig::train_blend),
                  field("val_blend", &DataConfig::val_blend),
                  field("test_prefix", &DataConfig::test_prefix),
                  field("test_blend", &DataConfig::test_blend),
                  field("split", &DataConfig::split, split_shares()),
                  field("seq_len", &DataConfig::seq_len, at_least(1)),
                  field("reset_position_ids", &DataConfig::reset_position_ids),
                  field("reset_attention_mask", &DataConfig::reset_attention_mask),
                  field("eod_mask_loss", &DataConfig::eod_mask_loss),
              }),
      section("optim", &RunConfig::optim,
              {
                  field("lr", &OptimConfig::lr, greater_than(0)),
                  field("min_lr", &OptimConfig::min_lr, at_least(0.0)),
                  field("beta1", &OptimConfig::beta1, in_unit_interval()),
                  field("beta2", &OptimConfig::beta2, in_unit_interval()),
                  field("eps", &OptimConfig::eps, greater_than(0)),
                  field("weight_decay", &OptimConfig::weight_decay, at_least(0.0)),
                  field("warmup_steps", &OptimConfig::warmup_steps, at_least(0)),
                  field("schedule", &OptimConfig::schedule),
                  field("decay_steps", &OptimConfig::decay_steps, at_least(0)),
                  field("wsd_decay_steps", &OptimConfig::wsd_decay_steps, at_least(0)),
                  field("wsd_decay_style", &OptimConfig::wsd_decay_style),
                  field("warmup_samples", &OptimConfig::warmup_samples, at_least<int64_t>(0)),
                  field("decay_samples", &OptimConfig::decay_samples, at_least<int64_t>(0)),
                  field("wsd_decay_samples", &OptimConfig::wsd_decay_samples, at_least<int64_t>(0)),
                  field("clip_grad", &OptimConfig::clip_grad, at_least(0.0)),
                  field("cpu_offload", &OptimConfig::cpu_offload),
                  field("offload_fraction", &OptimConfig::offload_fraction,
                        in_range(0.0, 1.0, " (the share of the state offloaded)")),
              }),
      section("train", &RunConfig::train,
              {
                  field("steps", &TrainConfig::steps, at_least(0)),
                  field("global_batch", &TrainConfig::global_batch, at_least(1)),
                  field("micro_batch", &TrainConfig::micro_batch, at_least(1)),
                  field("samples", &TrainConfig::samples, at_least<int64_t>(0)),
                  field("rampup_batch_size", &TrainConfig::rampup_batch_size, rampup_numbers()),
                  field("eval_interval", &TrainConfig::eval_interval, at_least(0)),
                  field("eval_batches", &TrainConfig::eval_batches, at_least(1)),
                  field("seed", &TrainConfig::seed),
                  field("resume", &TrainConfig::resume),
                  field("threads", &TrainConfig::threads, at_least(0)),
                  field("exit_interval", &TrainConfig::exit_interval, at_least(0)),
                  field("exit_duration_mins", &TrainConfig::exit_duration_mins, at_least(0.0)),
                  field("init_from", &TrainConfig::init_from),
                  field("skip_train", &TrainConfig::skip_train),
              }),
      section("checkpoint", &RunConfig::checkpoint,
              {
                  field("dir", &CheckpointConfig::dir),
                  field("interval", &CheckpointConfig::interval, at_least(0)),
                  field("keep", &CheckpointConfig::keep, at_least(1)),
                  field("async", &CheckpointConfig::async),
                  field("at_end", &CheckpointConfig::at_end),
              }),
      section("sft", &RunConfig::sft,
              {
                  field("train_files", &SftConfig::train_files),
                  field("train_weights", &SftConfig::train_weights, each_a_weight()),
                  field("chat_template", &SftConfig::chat_template),
                  field("train_roles", &SftConfig::train_roles, only_roles()),
                  field("last_turn_only", &SftConfig::last_turn_only),
                  field("packing", &SftConfig::packing),
                  field("val_fraction", &SftConfig::val_fraction, in_unit_interval()),
                  field("val_files", &SftConfig::val_files),
                  field("test_files", &SftConfig::test_files),
                  field("bad_lines", &SftConfig::bad_lines),
                  field("overlong", &SftConfig::overlong),
                  field("split_turns", &SftConfig::split_turns),
              }),
      section("grpo", &RunConfig::grpo, grpo_keys()),
      section("log", &RunConfig::log,
              {
                  field("interval", &LogConfig::interval, at_least(1)),
                  field("progress", &LogConfig::progress),
                  field("tensorboard", &LogConfig::tensorboard),
              }),
      section("profile", &RunConfig::profile,
              {
                  field("first_step", &ProfileConfig::first_step, at_least(0)),
                  field("last_step", &ProfileConfig::last_step, at_least(0)),
                  field("ranks", &ProfileConfig::ranks, each_at_least(0)),
                  field("synchronize", &ProfileConfig::synchronize),
              }),
      section("fault", &RunConfig::fault,
              {
                  field("kill_rank", &FaultConfig::kill_rank, at_least(-1)),
                  field("kill_step", &FaultConfig::kill_step, at_least(0)),
                  field("stall_rank", &FaultConfig::stall_rank, at_least(-1)),
                  field("stall_step", &FaultConfig::stall_step, at_least(0)),
                  field("stall_s", &FaultConfig::stall_s, at_least(0.0)),
                  field("corrupt_step", &FaultConfig::corrupt_step, at_least(0)),
                  field("repeat", &FaultConfig::repeat),
                  field("random_kills", &FaultConfig::random_kills, at_least(0)),
                  field("random_kill_window", &FaultConfig::random_kill_window, at_least(1)),
                  field("seed", &FaultConfig::seed),
              }),
  };
  return sections;
}

const SectionSchema* find_section(const std::string& name) {
  for (const auto& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

const Key<RunConfig>* find_key(const SectionSchema& section, const std::string& name) {
  for (const auto& k : section.keys)
    if (k.name == name) return &k;
  return nullptr;
}

// Resolves `section.key` (as written) to its descriptor, or throws naming it, the valid keys
// and the closest one. A key that exists in another section ("train.lr") points there.
const Key<RunConfig>& resolve(const std::string& where, const std::string& section_name, const std::string& key_name) {
  const SectionSchema* section = find_section(section_name);
  if (!section) unknown_key(where, section_name, "section", "sections", names_of(schema()));
  if (const Key<RunConfig>* key = find_key(*section, key_name)) return *key;
  std::string hint;
  for (const auto& other : schema()) {
    if (find_key(other, key_name)) {
      hint = "; did you mean " + in_quotes(other.name + "." + key_name) + "?";
      break;
    }
  }
  unknown_key(where, section_name + "." + key_name, "key", "keys of section " + in_quotes(section_name),
              names_of(section->keys), hint);
}

void apply_yaml(RunConfig& config, const YAML::Node& root, const std::string& source) {
  if (!root || root.IsNull()) return;  // an empty file: all defaults
  if (!root.IsMap())
    throw Error(at(source, root.Mark()) + ": a config must be a map of sections (run, model, data, ...), not " +
                (root.IsSequence() ? "a list" : "a single value"));
  std::set<std::string> seen;
  for (const auto& item : root) {
    const std::string where = at(source, item.first.Mark());
    if (!item.first.IsScalar()) throw Error(where + ": a section name must be a plain word");
    const std::string section_name = item.first.Scalar();
    const SectionSchema* section = find_section(section_name);
    if (!section) unknown_key(where, section_name, "section", "sections", names_of(schema()));
    if (item.second.IsNull()) continue;  // `train:` with nothing under it
    if (!item.second.IsMap())
      throw Error(where + ": section " + in_quotes(section_name) + " must be a map of key: value (keys: " +
                  join(names_of(section->keys)) + ")");
    for (const auto& entry : item.second) {
      const std::string key_where = at(source, entry.first.Mark());
      if (!entry.first.IsScalar()) throw Error(key_where + ": a key in section " + in_quotes(section_name) + " must be a plain word");
      const std::string key_name = entry.first.Scalar();
      const std::string path = section_name + "." + key_name;
      const Key<RunConfig>& key = resolve(key_where, section_name, key_name);
      // yaml-cpp keeps both copies of a repeated key; silently taking one would hide a mistake.
      if (!seen.insert(path).second) throw Error(key_where + ": key " + in_quotes(path) + " is given twice");
      const YAML::Node& value = entry.second;
      const std::string value_where = value.IsNull() ? key_where : at(source, value.Mark());
      key.parse(config, value, Origin{value_where, path});
    }
  }
}

void apply_override(RunConfig& config, const std::string& text) {
  const std::string where = "override " + in_quotes(text);
  std::string_view body = text;
  // NeMo/Hydra spellings: `+key=value` adds, `++key=value` adds or replaces; every key exists
  // here already, so all three mean "set".
  if (body.starts_with("++")) body.remove_prefix(2);
  else if (body.starts_with("+")) body.remove_prefix(1);
  size_t equals = body.find('=');
  if (equals == std::string_view::npos)
    throw Error(where + ": expected section.key=value (e.g. train.steps=100)");
  std::string dotted(body.substr(0, equals));
  std::string value_text(body.substr(equals + 1));
  size_t dot = dotted.find('.');
  if (dot == std::string::npos || dotted.find('.', dot + 1) != std::string::npos || dot == 0 ||
      dot + 1 == dotted.size()) {
    if (dot == std::string::npos && find_section(dotted) == nullptr) {
      // A bare key ("steps=5"): say which section it belongs to when there is exactly one.
      for (const auto& s : schema())
        if (find_key(s, dotted))
          throw Error(where + ": expected section.key=value; did you mean " + in_quotes(s.name + "." + dotted) + "?");
    }
    throw Error(where + ": expected section.key=value with exactly one '.' (e.g. train.steps=100)");
  }
  const Key<RunConfig>& key = resolve(where, dotted.substr(0, dot), dotted.substr(dot + 1));
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    throw Error(where + ": value " + in_quotes(value_text) + " is not valid YAML: " + e.msg);
  }
  key.parse(config, value, Origin{where, dotted});
}

}  // namespace detail

using namespace detail;

RunConfig parse_config(const std::string& yaml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    if (const int line = first_tab_indented_line(yaml_text))
      throw Error(source_name + ":" + std::to_string(line) +
                  ": a tab in the indentation: tabs are not allowed for indentation in YAML (use spaces)");
    throw Error(at(source_name, e.mark) + ": malformed YAML: " + e.msg);
  }
  // The value may come from the file or an override; name both places to look.
  auto in_source = [&](const Error& e) {
    return Error(source_name + (overrides.empty() ? "" : " (with overrides)") + ": " + e.what());
  };
  RunConfig config;
  try {
    apply_yaml(config, root, source_name);
    for (const auto& text : overrides) apply_override(config, text);
  } catch (const UnknownName& e) {
    throw in_source(e);
  }
  try {
    validate_config(config);
  } catch (const Error& e) {
    throw in_source(e);
  }
  return config;
}

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw Error("config file '" + path + "' does not exist (working directory: '" +
                std::filesystem::current_path(ec).string() + "')");
  if (std::filesystem::is_directory(path, ec))
    throw Error("config file '" + path + "' is a directory; expected a YAML file");
  return parse_config(read_file(path), path, overrides);
}

void validate_config(const RunConfig& c) {
  for (const auto& section : schema())
    for (const auto& key : section.keys) key.check(c, section.name + "." + key.name);
  check_key_relations(c);
}

std::string to_yaml(const RunConfig& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const auto& section : schema()) {
    out << YAML::Key << section.name << YAML::Value << YAML::BeginMap;
    for (const auto& key : section.keys) {
      out << YAML::Key << key.name << YAML::Value;
      key.emit(config, out);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  LOOM_CHECK(out.good(), "to_yaml: cannot write the config as YAML: " + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace loom::config
