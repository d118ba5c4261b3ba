#include "loom/rl/grpo_learner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/error.h"
#include "loom/rl/grpo_objective.h"
#include "loom/rl/rollout_rows.h"
#include "loom/train/trainer.h"
#include "loom/train/world_agreements.h"

namespace loom::rl {

nlohmann::json LearnerStep::to_json() const {
  nlohmann::json out = {{"step", step},
          {"loss", loss},
          {"trained_tokens", trained_tokens},
          {"samples", samples},
          {"zero_variance_groups", zero_variance_groups},
          {"filtered_samples", filtered_samples},
          {"rows", rows},
          {"packing_efficiency", packing_efficiency},
          {"reward_mean", reward_mean},
          {"reward_min", reward_min},
          {"reward_max", reward_max},
          {"kl", kl},
          {"clip_low_fraction", clip_low_fraction},
          {"clip_high_fraction", clip_high_fraction},
          {"dual_clip_fraction", dual_clip_fraction},
          {"importance_weight_mean", importance_weight_mean},
          {"importance_weight_min", importance_weight_min},
          {"importance_weight_max", importance_weight_max},
          {"masked_fraction", masked_fraction},
          {"truncated_fraction", truncated_fraction},
          {"token_mult_prob_error", token_mult_prob_error},
          {"generation_kl", generation_kl},
          {"policy_kl", policy_kl},
          {"js_divergence", js_divergence},
          {"approx_entropy", approx_entropy},
          {"grad_norm", grad_norm},
          {"lr", lr},
          {"seconds", seconds},
          {"skipped", skipped},
          {"updates", updates}};
  if (!update_losses.empty()) {
    out["update_losses"] = update_losses;
    out["update_grad_norms"] = update_grad_norms;
  }
  train::add_mtp_losses(mtp_losses, out);
  return out;
}

struct GrpoLearner::State {
  config::RunConfig config;
  comm::Communicator& world;
  RolloutSource source;
  std::unique_ptr<train::Trainer> trainer;
  Tensor reference;  // the reference policy's parameters (grpo.kl_coeff > 0), on the model's device
  std::unique_ptr<GrpoObjective> objective;

  State(const config::RunConfig& c, comm::Communicator& w) : config(c), world(w) {}
};

GrpoLearner::GrpoLearner(const config::RunConfig& config, comm::Communicator& world, std::ostream& console)
    : state_(std::make_unique<State>(config, world)) {
  State& s = *state_;
  LOOM_CHECK(!config.train.rampup_batch_size.on() && config.train.samples == 0,
             "train.rampup_batch_size and train.samples are for pre-training and fine-tuning: a GRPO step trains "
             "on the rows of its rollouts (at most train.global_batch), train.steps times");
  s.trainer = std::make_unique<train::Trainer>(config, world, s.source, nullptr, console);
  const bool with_reference = config.grpo.kl_coeff != 0.0;
  // The reference is where the run started: taken before a resume replaces the parameters.
  if (with_reference) s.reference = s.trainer->parameter_copy(config.train.init_from);
  s.trainer->restore();
  s.trainer->describe();
  if (s.trainer->reporter()) {
    const int rows = config.train.global_batch, seq = config.data.seq_len;
    const int minibatches = config.grpo.minibatches, epochs = config.grpo.epochs;
    const std::string unit = minibatches > 1 ? "an update" : "a step";
    if (minibatches * epochs > 1) {
      console << "grpo: " << minibatches * epochs << " optimizer updates a step (";
      if (minibatches > 1) {
        console << "grpo.minibatches " << minibatches << ", each on its share of the samples, in order";
      }
      if (minibatches > 1 && epochs > 1) console << "; ";
      if (epochs > 1) console << "grpo.epochs " << epochs << " passes over them";
      console << "), the later ones' ratios to the policy the step started from\n";
    }
    if (config.grpo.packing) {
      console << "grpo: " << (minibatches > 1 ? "an update's" : "each step's") << " samples packed into rows of " << seq
              << " tokens (first-fit decreasing); " << unit << " trains on the rows they fill, a multiple of "
              << s.trainer->batch_unit() << ", at most " << rows << " (train.global_batch)\n";
    } else {
      console << "grpo: one sample per row of " << seq << " tokens, " << rows << " rows " << unit
              << " (grpo.packing false)\n";
    }
  }
  s.objective = std::make_unique<GrpoObjective>(LossOptions::from_config(config.grpo),
                                                with_reference ? &s.reference : nullptr);
  s.trainer->set_objective(s.objective.get());
}

GrpoLearner::~GrpoLearner() = default;

train::Trainer& GrpoLearner::trainer() { return *state_->trainer; }
int64_t GrpoLearner::weight_version() const { return state_->trainer->progress().step; }
std::string GrpoLearner::save() { return state_->trainer->save(); }
void GrpoLearner::finish() { state_->trainer->finish(); }

namespace {

// The objective's statistics over the world's replicas, into `out`.
void agree_statistics(comm::Communicator& world, bool contributes, const LossStatistics& mine, LearnerStep& out) {
  const bool any = mine.tokens > 0;
  const double lowest = -std::numeric_limits<double>::infinity();
  std::vector<double> sums = {static_cast<double>(mine.tokens), mine.kl_sum, static_cast<double>(mine.clipped_low),
                              static_cast<double>(mine.clipped_high), static_cast<double>(mine.dual_clipped),
                              mine.weight_sum, static_cast<double>(mine.masked), static_cast<double>(mine.truncated),
                              mine.mult_prob_error_sum, mine.generation_kl_sum, mine.policy_kl_sum,
                              mine.js_divergence_sum, mine.entropy_sum};
  std::vector<double> maxima = {any ? mine.weight_max : lowest, any ? -mine.weight_min : lowest};
  train::agree_sums_and_maxima(world, contributes, sums, maxima);
  const double tokens = std::max(1.0, sums[0]);
  out.kl = sums[1] / tokens;
  out.clip_low_fraction = sums[2] / tokens;
  out.clip_high_fraction = sums[3] / tokens;
  out.dual_clip_fraction = sums[4] / tokens;
  out.importance_weight_mean = sums[5] / tokens;
  out.masked_fraction = sums[6] / tokens;
  out.truncated_fraction = sums[7] / tokens;
  out.token_mult_prob_error = sums[8] / tokens;
  out.generation_kl = sums[9] / tokens;
  out.policy_kl = sums[10] / tokens;
  out.js_divergence = sums[11] / tokens;
  out.approx_entropy = sums[12] / tokens;
  out.importance_weight_max = std::isfinite(maxima[0]) ? maxima[0] : 0.0;
  out.importance_weight_min = std::isfinite(maxima[1]) ? -maxima[1] : 0.0;
}

}  // namespace

LearnerStep GrpoLearner::step(const std::vector<RolloutGroup>& groups) {
  State& s = *state_;
  RolloutRows rows = make_rollout_rows(groups, s.config.grpo, s.config.train.global_batch, s.config.data.seq_len,
                                       s.trainer->batch_unit());
  LearnerStep out;
  out.samples = rows.samples;
  out.rows = rows.rows;
  out.packing_efficiency = rows.packing_efficiency;
  out.zero_variance_groups = rows.zero_variance_groups;
  out.filtered_samples = rows.filtered_samples;
  out.reward_mean = rows.samples > 0 ? rows.reward_sum / static_cast<double>(rows.samples) : 0.0;
  out.reward_min = rows.reward_min;
  out.reward_max = rows.reward_max;
  std::vector<GrpoObjective::UpdateTotals> totals;
  std::vector<int64_t> update_rows;
  const int epochs = s.config.grpo.epochs;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (const RolloutMinibatch& m : rows.minibatches) {
      totals.push_back({m.trained_targets, m.trained_samples});
      update_rows.push_back(m.rows);
    }
  }
  s.objective->set_step_totals(std::move(totals), static_cast<int>(rows.minibatches.size()));
  s.source.set(std::move(rows), s.trainer->progress().consumed_samples, epochs);
  const train::StepResult result = s.trainer->step(0, update_rows);
  out.step = result.step;
  out.updates = static_cast<int64_t>(update_rows.size());
  if (out.updates > 1) {
    out.update_losses = result.update_losses;
    out.update_grad_norms = result.update_grad_norms;
  }
  out.loss = result.loss;
  out.trained_tokens = result.trained_tokens;
  out.grad_norm = result.grad_norm;
  out.lr = result.lr;
  out.seconds = result.seconds;
  out.skipped = result.skipped;
  if (s.config.grpo.mtp_loss_weight > 0.0) out.mtp_losses = result.mtp_losses;
  agree_statistics(s.world, s.trainer->holds_loss(), s.objective->statistics(), out);
  return out;
}

}  // namespace loom::rl
