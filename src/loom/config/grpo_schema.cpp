#include "loom/config/grpo_schema.h"

#include <string>

#include "loom/config/grpo_environments.h"
#include "loom/config/map_values.h"
#include "loom/core/error.h"

namespace loom::config {

namespace detail {

namespace {
// grpo.dual_clip: 0 (off) or above 1 (a bound on the ratio for negative advantages).
Check<double> off_or_above_one() {
  return [](const double& value) -> std::optional<std::string> {
    if (value == 0.0 || value > 1.0) return std::nullopt;
    return std::string("must be 0 (off) or > 1 (NeMo RL's ratio_clip_c, typically 3)");
  };
}

// grpo.top_p: a nucleus of (0, 1].
Check<double> nucleus() {
  return [](const double& value) -> std::optional<std::string> {
    if (value > 0.0 && value <= 1.0) return std::nullopt;
    return std::string("must be in (0, 1]");
  };
}

// A grpo.environments entry's count that is 0 (the run's key) or in [low, high].
Check<int> run_key_or_in(int low, int high, const char* run_key) {
  return [=](const int& value) -> std::optional<std::string> {
    if (value == 0 || (value >= low && value <= high)) return std::nullopt;
    return "must be 0 (" + std::string(run_key) + ") or in [" + std::to_string(low) + ", " + std::to_string(high) + "]";
  };
}

const char* const kTasks[] = {"arithmetic", "countdown", "calculator"};

// A grpo.environments entry's task: empty (grpo.environment) or one of kTasks.
Check<std::string> run_key_or_task() {
  return [](const std::string& value) -> std::optional<std::string> {
    for (const char* task : kTasks) {
      if (value.empty() || value == task) return std::nullopt;
    }
    return std::string("must be one of arithmetic, countdown, calculator (or empty: grpo.environment)");
  };
}
}  // namespace

// Keys of one grpo.environments entry.
const std::vector<Key<GrpoEnvironment>>& environment_keys() {
  static const std::vector<Key<GrpoEnvironment>> keys = {
      field("name", &GrpoEnvironment::name),
      field("task", &GrpoEnvironment::task, run_key_or_task()),
      field("weight", &GrpoEnvironment::weight, [](const double& v) { return weight_problem(v); }),
      field("task_digits", &GrpoEnvironment::task_digits, run_key_or_in(1, 9, "grpo.task_digits")),
      field("task_numbers", &GrpoEnvironment::task_numbers, run_key_or_in(2, 8, "grpo.task_numbers")),
      field("servers", &GrpoEnvironment::servers, at_least(0)),
      field("max_turns", &GrpoEnvironment::max_turns, at_least(0)),
      field("max_tokens", &GrpoEnvironment::max_tokens, at_least(0)),
  };
  return keys;
}

struct EnvironmentNames {
  static const std::vector<Key<GrpoEnvironment>>& keys() { return environment_keys(); }
  static constexpr const char* kExpected =
      "a list of maps with keys name, task, weight, task_digits, task_numbers, servers, max_turns, max_tokens "
      "(e.g. [{task: countdown, weight: 3}, {task: calculator, max_turns: 2}])";
  static constexpr const char* kEntry = "a grpo.environments entry";
};

template <>
struct Value<std::vector<GrpoEnvironment>> : MapListValue<GrpoEnvironment, EnvironmentNames> {};

std::vector<Key<GrpoConfig>> grpo_keys() {
  return {
      field("clip_low", &GrpoConfig::clip_low, in_unit_interval()),
      field("clip_high", &GrpoConfig::clip_high, at_least(0.0)),
      field("dual_clip", &GrpoConfig::dual_clip, off_or_above_one()),
      field("kl_coeff", &GrpoConfig::kl_coeff, at_least(0.0)),
      field("kl_type", &GrpoConfig::kl_type),
      field("kl_input_clamp", &GrpoConfig::kl_input_clamp, at_least(0.0)),
      field("kl_output_clamp", &GrpoConfig::kl_output_clamp, at_least(0.0)),
      field("on_policy_kl", &GrpoConfig::on_policy_kl),
      field("importance_correction", &GrpoConfig::importance_correction),
      field("tis_cap", &GrpoConfig::tis_cap, greater_than(0)),
      field("icepop_low", &GrpoConfig::icepop_low, at_least(0.0)),
      field("icepop_high", &GrpoConfig::icepop_high, greater_than(0)),
      field("seq_mask_low", &GrpoConfig::seq_mask_low, at_least(0.0)),
      field("seq_mask_high", &GrpoConfig::seq_mask_high, greater_than(0)),
      field("loss_aggregation", &GrpoConfig::loss_aggregation),
      field("ratio_level", &GrpoConfig::ratio_level),
      field("leave_one_out", &GrpoConfig::leave_one_out),
      field("normalize_std", &GrpoConfig::normalize_std),
      field("std_epsilon", &GrpoConfig::std_epsilon, at_least(0.0)),
      field("overlong_buffer", &GrpoConfig::overlong_buffer, at_least(0)),
      field("overlong_penalty", &GrpoConfig::overlong_penalty, at_least(0.0)),
      field("overlong_max_tokens", &GrpoConfig::overlong_max_tokens, at_least(0)),
      field("overlong_filter", &GrpoConfig::overlong_filter),
      field("dynamic_sampling", &GrpoConfig::dynamic_sampling),
      field("dynamic_sampling_max_draws", &GrpoConfig::dynamic_sampling_max_draws, at_least(1)),
      field("packing", &GrpoConfig::packing),
      field("minibatches", &GrpoConfig::minibatches, at_least(1)),
      field("epochs", &GrpoConfig::epochs, at_least(1)),
      field("environment", &GrpoConfig::environment, one_of({kTasks[0], kTasks[1], kTasks[2]})),
      field("environments", &GrpoConfig::environments),
      field("task_digits", &GrpoConfig::task_digits, in_range(1, 9, "")),
      field("task_numbers", &GrpoConfig::task_numbers, in_range(2, 8, "")),
      field("samples_per_prompt", &GrpoConfig::samples_per_prompt, at_least(1)),
      field("prompts_per_step", &GrpoConfig::prompts_per_step, at_least(1)),
      field("max_turns", &GrpoConfig::max_turns, at_least(1)),
      field("max_tokens", &GrpoConfig::max_tokens, at_least(1)),
      field("temperature", &GrpoConfig::temperature, greater_than(0)),
      field("top_p", &GrpoConfig::top_p, nucleus()),
      field("launch", &GrpoConfig::launch, one_of({"local", "external"})),
      field("register_timeout_s", &GrpoConfig::register_timeout_s, greater_than(0)),
      field("generation_workers", &GrpoConfig::generation_workers, at_least(1)),
      field("environment_servers", &GrpoConfig::environment_servers, at_least(1)),
      field("worker_kv_cache_mb", &GrpoConfig::worker_kv_cache_mb, at_least(1)),
      field("worker_dtype", &GrpoConfig::worker_dtype, one_of({"auto", "fp32", "bf16", "fp16"})),
      field("worker_speculative_tokens", &GrpoConfig::worker_speculative_tokens, at_least(0)),
      field("mtp_loss_weight", &GrpoConfig::mtp_loss_weight, at_least(0.0)),
      field("rollout_threads", &GrpoConfig::rollout_threads, at_least(0)),
      field("max_staleness", &GrpoConfig::max_staleness, at_least(0)),
      field("inflight_updates", &GrpoConfig::inflight_updates, one_of({"continue", "wait"})),
      field("verify_refit", &GrpoConfig::verify_refit),
      field("refit", &GrpoConfig::refit, one_of({"checkpoint", "comm"})),
      field("refit_bucket_mb", &GrpoConfig::refit_bucket_mb, in_range(1, 2047, "")),
      field("episode_failure", &GrpoConfig::episode_failure, one_of({"retry", "drop"})),
      field("episode_retries", &GrpoConfig::episode_retries, at_least(0)),
      field("generation_timeout_s", &GrpoConfig::generation_timeout_s, greater_than(0)),
      field("environment_timeout_s", &GrpoConfig::environment_timeout_s, greater_than(0)),
      field("step_timeout_s", &GrpoConfig::step_timeout_s, greater_than(0)),
      field("max_role_restarts", &GrpoConfig::max_role_restarts, at_least(0)),
      field("validation_prompts", &GrpoConfig::validation_prompts, at_least(0)),
      field("validation_interval", &GrpoConfig::validation_interval, at_least(1)),
      field("validation_first_index", &GrpoConfig::validation_first_index, at_least(0)),
      field("validation_samples", &GrpoConfig::validation_samples, at_least(1)),
      field("validation_temperature", &GrpoConfig::validation_temperature, at_least(0.0)),
  };
}

}  // namespace detail

namespace {
// grpo.environment and its keys, or grpo.environments: names distinct, a calculator with a
// second turn.
void check_grpo_environments(const GrpoConfig& g) {
  const std::vector<GrpoEnvironment> environments = run_environments(g);
  for (size_t i = 0; i < environments.size(); ++i) {
    const GrpoEnvironment& e = environments[i];
    const std::string key = g.environments.empty() ? "grpo" : "grpo.environments[" + std::to_string(i) + "]";
    for (size_t j = 0; j < i; ++j) {
      LOOM_CHECK(environments[j].name != e.name,
                 key + ".name = '" + e.name + "' is also grpo.environments[" + std::to_string(j) +
                     "]'s (an entry without a name takes its task's): give each environment a distinct name");
    }
    LOOM_CHECK(e.task != "calculator" || e.max_turns >= 2,
               (g.environments.empty() || g.environments[i].max_turns == 0 ? std::string("grpo") : key) +
                   ".max_turns = " + std::to_string(e.max_turns) + " with " +
                   (g.environments.empty() || g.environments[i].task.empty() ? "grpo.environment" : key + ".task") +
                   " = 'calculator': a tool call needs a second turn for the answer; use >= 2");
  }
}
}  // namespace

void check_grpo(const RunConfig& config) {
  using detail::format_double;
  const GrpoConfig& g = config.grpo;
  LOOM_CHECK(g.icepop_low < g.icepop_high, "grpo.icepop_low = " + format_double(g.icepop_low) +
                                               " is invalid: must be below grpo.icepop_high = " +
                                               format_double(g.icepop_high));
  LOOM_CHECK(g.seq_mask_low < g.seq_mask_high, "grpo.seq_mask_low = " + format_double(g.seq_mask_low) +
                                                   " is invalid: must be below grpo.seq_mask_high = " +
                                                   format_double(g.seq_mask_high));
  LOOM_CHECK(g.ratio_level != RatioLevel::Sequence || g.importance_correction != ImportanceCorrection::SeqMaskTis,
             "grpo.importance_correction = 'seq_mask_tis' keeps each token's own weight in the samples it keeps, and "
             "grpo.ratio_level = 'sequence' (GSPO) weighs a sample by one weight: use tis or icepop with it");
  LOOM_CHECK(g.ratio_level != RatioLevel::Sequence || g.loss_aggregation == LossAggregation::SeqMeanTokenMean,
             "grpo.ratio_level = 'sequence' (GSPO) gives each sample one ratio and one loss: it needs "
             "grpo.loss_aggregation = 'seq_mean_token_mean' (the samples' mean), not '" +
                 std::string(name_of(g.loss_aggregation)) + "'");
  LOOM_CHECK(g.overlong_buffer == 0 || (g.overlong_max_tokens > 0 && g.overlong_buffer <= g.overlong_max_tokens),
             "grpo.overlong_buffer = " + std::to_string(g.overlong_buffer) +
                 " needs grpo.overlong_max_tokens (the generation's response limit) at least as large; it is " +
                 std::to_string(g.overlong_max_tokens));
  LOOM_CHECK(g.refit != "comm" || g.launch == "external",
             "grpo.refit = 'comm' needs grpo.launch = 'external' (the learner and the generation workers in one MPI job); "
             "with grpo.launch = 'local' the refit is through the checkpoint");
  LOOM_CHECK(g.refit != "comm" || g.inflight_updates == "continue",
             "grpo.refit = 'comm' with grpo.inflight_updates = 'wait': the workers load what the learner sends as it arrives; "
             "use inflight_updates = 'continue' or refit = 'checkpoint'");
  LOOM_CHECK(g.worker_speculative_tokens <= config.model.mtp_depths,
             "grpo.worker_speculative_tokens = " + std::to_string(g.worker_speculative_tokens) +
                 " drafts need as many multi-token prediction depths; model.mtp_depths is " +
                 std::to_string(config.model.mtp_depths));
  LOOM_CHECK(g.mtp_loss_weight == 0.0 || config.model.mtp_depths > 0,
             "grpo.mtp_loss_weight = " + format_double(g.mtp_loss_weight) +
                 " trains the model's multi-token prediction depths, and model.mtp_depths is 0: set it to 0");
  LOOM_CHECK(g.minibatches <= g.prompts_per_step * g.samples_per_prompt,
             "grpo.minibatches = " + std::to_string(g.minibatches) + " updates a step, each on a share of its " +
                 std::to_string(g.prompts_per_step * g.samples_per_prompt) +
                 " samples (grpo.prompts_per_step x grpo.samples_per_prompt): use at most that many");
  check_grpo_environments(g);
}

}  // namespace loom::config
