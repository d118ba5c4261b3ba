#pragma once
// The `grpo` section (docs/grpo.md): GRPO's loss and learner settings, and the runtime's: how
// rollouts are generated (environment, group size, turns, sampling), how many groups a learner
// step takes, the staleness bound, and how the controller treats failures and weight updates.
// Declared and checked in grpo_schema.cpp like every other section.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loom/config/enums.h"

namespace loom::config {

// grpo.importance_correction: how off-policy tokens are weighted by exp(old - generation
// log-probability): not at all, truncated at grpo.tis_cap, zeroed outside
// [grpo.icepop_low, grpo.icepop_high], or kept as they are in samples whose geometric-mean weight
// lies in [grpo.seq_mask_low, grpo.seq_mask_high] and zeroed in the others (seq_mask_tis).
enum class ImportanceCorrection : uint8_t { None, Tis, Icepop, SeqMaskTis };
constexpr std::array<std::string_view, 4> names(ImportanceCorrection) {
  return {"none", "tis", "icepop", "seq_mask_tis"};
}

// grpo.loss_aggregation: how the token losses of a step make its loss. token_mean: their sum
// over the step's trained tokens (DAPO, NeMo RL's token_level_loss); seq_mean_token_mean: each
// sample's token mean, averaged over the samples (the GRPO paper, NeMo RL's token_level_loss:
// false); seq_mean_token_sum_norm: their sum over the samples times the most tokens a sample can
// train on, grpo.max_turns x grpo.max_tokens, the largest of the environments' (Dr. GRPO).
enum class LossAggregation : uint8_t { TokenMean, SeqMeanTokenMean, SeqMeanTokenSumNorm };
constexpr std::array<std::string_view, 3> names(LossAggregation) {
  return {"token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"};
}

// grpo.kl_type: the per-token estimator of the KL to the reference (Schulman's k1, k2, k3 over
// logr = ref - logp: -logr, logr^2 / 2, e^logr - 1 - logr).
enum class KlType : uint8_t { K1, K2, K3 };
constexpr std::array<std::string_view, 3> names(KlType) { return {"k1", "k2", "k3"}; }

// grpo.ratio_level: the PPO ratio and the importance weight per token (GRPO), or per sample
// (GSPO, NeMo RL's sequence_level_importance_ratios): the geometric mean of the sample's token
// ratios, and its sequence likelihood ratio to the generation policy, shared by its tokens.
enum class RatioLevel : uint8_t { Token, Sequence };
constexpr std::array<std::string_view, 2> names(RatioLevel) { return {"token", "sequence"}; }

// One entry of grpo.environments: an environment the rollouts draw prompts from, in proportion
// to its weight (docs/grpo.md, "Several environments"). Zeros and empty strings take the run's
// grpo key of the name (grpo.environment for the task, grpo.environment_servers for servers).
struct GrpoEnvironment {
  std::string name;          // its name in metrics, logs and roles.json; empty: the task's
  std::string task;          // arithmetic | countdown | calculator (loom env serve --task); empty: grpo.environment
  double weight = 1.0;       // its share of the prompts: weight / the weights' sum
  int task_digits = 0;       // 0: grpo.task_digits
  int task_numbers = 0;      // 0: grpo.task_numbers
  int servers = 0;           // its `loom env serve` processes; 0: grpo.environment_servers
  int max_turns = 0;         // 0: grpo.max_turns
  int max_tokens = 0;        // 0: grpo.max_tokens
};

struct GrpoConfig {
  // The loss.
  double clip_low = 0.2;    // the ratio's lower clip: 1 - clip_low
  double clip_high = 0.2;   // the ratio's upper clip: 1 + clip_high
  double dual_clip = 0.0;   // 0: off; else c > 1 bounds -A r by -A c for negative advantages
  double kl_coeff = 0.01;   // the KL penalty's weight; 0: no reference policy
  KlType kl_type = KlType::K3;
  double kl_input_clamp = 0.0;   // logr clamped to [-c, c] (no gradient beyond); 0: off
  double kl_output_clamp = 0.0;  // the estimate clamped to [-c, c] (no gradient beyond); 0: off
  bool on_policy_kl = false;  // the KL term weighted by exp(logp - gen): its estimate under the current policy
  ImportanceCorrection importance_correction = ImportanceCorrection::None;
  double tis_cap = 2.0;
  double icepop_low = 0.5, icepop_high = 5.0;
  double seq_mask_low = 0.999, seq_mask_high = 1.002;  // seq_mask_tis's band (NeMo RL's reference bounds)
  LossAggregation loss_aggregation = LossAggregation::TokenMean;
  RatioLevel ratio_level = RatioLevel::Token;
  bool leave_one_out = true;    // a sample's baseline the mean of the others' rewards; false: of the group's
  bool normalize_std = true;    // advantages divided by the baseline's rewards' std (Bessel-corrected)
  double std_epsilon = 1e-6;
  int overlong_buffer = 0;         // DAPO's soft overlong penalty over the last N tokens; 0: off
  double overlong_penalty = 1.0;   // its largest penalty
  int overlong_max_tokens = 0;     // the response length limit it counts to (the generation limit)
  bool overlong_filter = false;    // truncated samples leave the loss
  bool dynamic_sampling = false;   // DAPO: groups whose samples are all rewarded alike are dropped and refilled
  int dynamic_sampling_max_draws = 10;  // the run fails after this many x prompts_per_step such groups in a row
  // The learner's rows.
  bool packing = true;  // samples packed into rows (first-fit decreasing); false: one per row
  int minibatches = 1;  // optimizer updates a step takes, each on its share of the samples (PPO's minibatches)
  int epochs = 1;       // passes over the minibatches a step takes (the GRPO paper's mu, PPO's epochs)
  // Rollouts. One environment (environment, task_digits, task_numbers, environment_servers), or
  // several (environments, whose entries default to those keys; resolved by
  // config/grpo_environments.h).
  std::string environment = "countdown";  // arithmetic | countdown | calculator (loom env serve --task)
  std::vector<GrpoEnvironment> environments;  // several environments; empty: the one above
  int task_digits = 2;                    // arithmetic, calculator: operands of up to this many digits
  int task_numbers = 4;                   // countdown: how many numbers are given
  int samples_per_prompt = 4;             // n: the size of a group
  int prompts_per_step = 8;               // groups one learner step trains on (the global batch)
  int max_turns = 1;                      // model turns per episode (tool calls in between)
  int max_tokens = 32;                    // sampled tokens per model turn
  double temperature = 1.0;
  double top_p = 1.0;
  // Roles.
  std::string launch = "local";           // local: the controller starts every role; external: a launcher does (mpirun MPMD, srun)
  double register_timeout_s = 300.0;      // external: how long the controller waits for every role to register
  int generation_workers = 1;             // `loom serve` processes
  int environment_servers = 1;            // `loom env serve` processes
  int worker_kv_cache_mb = 64;            // each worker's --kv-cache-mb
  std::string worker_dtype = "auto";      // each worker's --dtype: auto (bf16 on cuda, fp32 on cpu), fp32, bf16, fp16
  int worker_speculative_tokens = 0;      // each worker's drafts a step from the model's MTP depths (0: none)
  double mtp_loss_weight = 0.0;           // the MTP depths' draft loss, which trains them alone (0: none)
  int rollout_threads = 0;                // groups generated at once; 0: 2 per generation worker
  int rollout_thread_count() const { return rollout_threads > 0 ? rollout_threads : 2 * generation_workers; }
  // Staleness and weight updates.
  int max_staleness = 1;                  // step s trains on groups of weight version >= s - k; 0: synchronous
  std::string inflight_updates = "continue";  // continue: running requests go on with the new weights; wait: they finish first
  bool verify_refit = false;              // after each refit, every worker's weights digest must equal the checkpoint's
  std::string refit = "checkpoint";       // checkpoint: workers load the learner's checkpoint; comm: buckets over MPI (one job)
  int refit_bucket_mb = 64;               // comm: the size of one message of parameters
  // Failures.
  std::string episode_failure = "retry";  // retry | drop: an episode whose environment or worker failed
  int episode_retries = 3;                // retries of one group before it is dropped
  double generation_timeout_s = 300.0;    // one chat request
  double environment_timeout_s = 30.0;    // one environment request
  double step_timeout_s = 1800.0;         // the learner waiting for one step's groups
  int max_role_restarts = 10;             // restarts of one environment server or worker before the run fails
  // Validation: held-out prompts (task indices from validation_first_index on, never trained),
  // answered by the workers before training and every validation_interval steps.
  int validation_prompts = 0;             // 0: no validation
  int validation_interval = 10;           // learner steps between validations (and after the last)
  int validation_first_index = 1000000;      // the environment task index of the first held-out prompt
  int validation_samples = 1;             // answers per held-out prompt
  double validation_temperature = 0.0;    // 0: greedy
};

}  // namespace loom::config
