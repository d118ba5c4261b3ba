#include "loom/rl/rollout_rows.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/rl/grpo_loss.h"

namespace loom::rl {

namespace {

std::string where(size_t group, size_t sample) {
  return "rollout group " + std::to_string(group) + " sample " + std::to_string(sample);
}

void check_sample(const Rollout& s, size_t group, size_t sample, int seq) {
  const size_t n = s.tokens.size();
  LOOM_CHECK(s.trained.size() == n && s.generation_logprobs.size() == n,
             where(group, sample) + ": " + std::to_string(n) + " tokens but " + std::to_string(s.trained.size()) +
                 " trained marks and " + std::to_string(s.generation_logprobs.size()) +
                 " generation log-probabilities (one each per token)");
  LOOM_CHECK(n >= 2 && n <= static_cast<size_t>(seq) + 1,
             where(group, sample) + " has " + std::to_string(n) + " tokens; a learner row takes 2 to data.seq_len + 1 = " +
                 std::to_string(seq + 1) + " (raise data.seq_len or lower the generation's token limit)");
}

// Writes one sample into row `row` of `out`.
void write_row(const Rollout& s, double advantage, int row, RolloutRows& out) {
  const size_t base = static_cast<size_t>(row) * static_cast<size_t>(out.seq);
  for (size_t j = 0; j + 1 < s.tokens.size(); ++j) {
    out.inputs[base + j] = s.tokens[j];
    out.targets[base + j] = s.tokens[j + 1];
    out.weights[base + j] = s.trained[j + 1] != 0 ? 1.0f : 0.0f;
    out.advantages[base + j] = static_cast<float>(advantage);
    out.generation_logprobs[base + j] = s.generation_logprobs[j + 1];
  }
}

}  // namespace

RolloutRows make_rollout_rows(const std::vector<RolloutGroup>& groups, const config::GrpoConfig& grpo, int rows, int seq) {
  RolloutRows out;
  out.rows = rows;
  out.seq = seq;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(seq);
  out.inputs.assign(n, 0);
  out.targets.assign(n, 0);
  out.weights.assign(n, 0.0f);
  out.advantages.assign(n, 0.0f);
  out.generation_logprobs.assign(n, 0.0f);
  for (const RolloutGroup& g : groups) out.samples += static_cast<int64_t>(g.samples.size());
  LOOM_CHECK(out.samples <= rows, "a learner step got " + std::to_string(out.samples) +
                                      " samples but train.global_batch = " + std::to_string(rows) +
                                      " rows: raise train.global_batch to prompts x samples per prompt");
  int row = 0;
  bool first = true;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    RolloutGroup group = groups[gi];
    for (size_t si = 0; si < group.samples.size(); ++si) check_sample(group.samples[si], gi, si, seq);
    if (grpo.overlong_buffer > 0) {
      shape_overlong_rewards(group, grpo.overlong_max_tokens, grpo.overlong_buffer, grpo.overlong_penalty);
    }
    std::vector<double> rewards;
    for (const Rollout& s : group.samples) rewards.push_back(s.reward);
    const GroupAdvantages a = group_advantages(rewards, grpo.normalize_std, grpo.std_epsilon);
    out.zero_variance_groups += a.zero_variance ? 1 : 0;
    if (grpo.overlong_filter) out.filtered_samples += filter_overlong(group);
    for (size_t si = 0; si < group.samples.size(); ++si) {
      const double r = rewards[si];
      out.reward_sum += r;
      out.reward_min = first ? r : std::min(out.reward_min, r);
      out.reward_max = first ? r : std::max(out.reward_max, r);
      first = false;
      write_row(group.samples[si], a.advantages[si], row++, out);
    }
  }
  return out;
}

void RolloutSource::set(RolloutRows rows, int64_t first_sample) {
  rows_ = std::move(rows);
  first_sample_ = first_sample;
}

void RolloutSource::fill(int64_t first, train::TokenBatch& batch) const {
  const int64_t row0 = first - first_sample_;
  LOOM_CHECK(row0 >= 0 && row0 + batch.batch <= rows_.rows && batch.seq == rows_.seq,
             "GRPO rollouts: samples [" + std::to_string(first) + ", " + std::to_string(first + batch.batch) +
                 ") asked of a step holding [" + std::to_string(first_sample_) + ", " +
                 std::to_string(first_sample_ + rows_.rows) + ")");
  const size_t begin = static_cast<size_t>(row0) * static_cast<size_t>(rows_.seq);
  const size_t count = static_cast<size_t>(batch.batch) * static_cast<size_t>(batch.seq);
  auto slice = [&](const auto& from, auto& into) {
    into.assign(from.begin() + static_cast<std::ptrdiff_t>(begin), from.begin() + static_cast<std::ptrdiff_t>(begin + count));
  };
  slice(rows_.inputs, batch.inputs);
  slice(rows_.targets, batch.targets);
  slice(rows_.weights, batch.loss_weights);
  slice(rows_.advantages, batch.advantages);
  slice(rows_.generation_logprobs, batch.generation_logprobs);
}

int64_t trained_targets(const RolloutRows& rows) {
  return std::count(rows.weights.begin(), rows.weights.end(), 1.0f);
}

int64_t samples_in_training(const RolloutRows& rows) {
  int64_t samples = 0;
  for (int r = 0; r < rows.rows; ++r) {
    const auto row = rows.weights.begin() + static_cast<std::ptrdiff_t>(r) * rows.seq;
    samples += std::find(row, row + rows.seq, 1.0f) != row + rows.seq;
  }
  return samples;
}

}  // namespace loom::rl
