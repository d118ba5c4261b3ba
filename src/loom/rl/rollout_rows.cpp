#include "loom/rl/rollout_rows.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/data/chat/packing.h"
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

// A sample with its advantage and its count of trained targets, in the step's order (groups,
// then their samples).
struct Placed {
  const Rollout* sample;
  double advantage;
  int32_t trained_targets;
};

// The targets of sample `s` that are trained on: its sampled tokens but the first token.
int32_t trained_targets_of(const Rollout& s) {
  return static_cast<int32_t>(std::count(s.trained.begin() + 1, s.trained.end(), 1));
}

// Writes sample `s` into the slots from `slot` on, as document `document` of its row.
void place(const Placed& p, int64_t slot, int32_t document, RolloutRows& out) {
  const Rollout& s = *p.sample;
  for (size_t j = 0; j + 1 < s.tokens.size(); ++j) {
    const size_t at = static_cast<size_t>(slot) + j;
    out.inputs[at] = s.tokens[j];
    out.targets[at] = s.tokens[j + 1];
    out.weights[at] = s.trained[j + 1] != 0 ? 1.0f : 0.0f;
    out.advantages[at] = static_cast<float>(p.advantage);
    out.generation_logprobs[at] = s.generation_logprobs[j + 1];
    out.sample_targets[at] = p.trained_targets;
    if (!out.documents.empty()) {
      out.documents[at] = document;
      out.positions[at] = static_cast<int32_t>(j);
    }
  }
}

// One update's samples placed in rows (packed or one per row), appended to `out`'s: the filled
// rows rounded up to `row_unit` when packed, else `max_rows`. Returns the rows it took.
int64_t lay_out(std::span<const Placed> placed, bool packing, int max_rows, int64_t row_unit, int minibatches,
                RolloutRows& out) {
  std::vector<int64_t> lengths;
  for (const Placed& p : placed) lengths.push_back(static_cast<int64_t>(p.sample->tokens.size()) - 1);
  const std::vector<std::vector<int64_t>> layout =
      packing ? data::pack_first_fit_decreasing(lengths, out.seq) : data::one_per_row(lengths, out.seq);
  const int64_t filled = static_cast<int64_t>(layout.size());
  const std::string whose = minibatches > 1 ? "an update's (of grpo.minibatches = " + std::to_string(minibatches) + ") "
                                            : "a learner step's ";
  LOOM_CHECK(filled <= max_rows,
             whose + std::to_string(placed.size()) + " samples " +
                 (packing ? "packed fill " + std::to_string(filled) + " rows of data.seq_len " +
                                std::to_string(out.seq) + " but train.global_batch = "
                          : "need as many rows but train.global_batch = ") +
                 std::to_string(max_rows) + ": raise train.global_batch to prompts x samples per prompt" +
                 (minibatches > 1 ? " / grpo.minibatches" : "") +
                 (packing ? " or lower the generation's token limit" : ""));
  const int64_t rounded = (filled + row_unit - 1) / row_unit * row_unit;
  const int64_t rows = packing ? std::min<int64_t>(std::max<int64_t>(rounded, row_unit), max_rows) : max_rows;
  const size_t begin = static_cast<size_t>(out.rows) * static_cast<size_t>(out.seq);
  const size_t n = begin + static_cast<size_t>(rows) * static_cast<size_t>(out.seq);
  out.inputs.resize(n, 0);
  out.targets.resize(n, 0);
  out.weights.resize(n, 0.0f);
  out.advantages.resize(n, 0.0f);
  out.generation_logprobs.resize(n, 0.0f);
  out.sample_targets.resize(n, 0);
  if (packing) {
    out.documents.resize(n, 0);
    out.positions.resize(n, 0);
  }
  const std::vector<int64_t> none;  // the samples of a row past the layout's: padding alone
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row_end = static_cast<int64_t>(begin) + (r + 1) * out.seq;
    int64_t slot = row_end - out.seq;
    int32_t document = 0;
    for (int64_t i : r < filled ? layout[static_cast<size_t>(r)] : none) {
      place(placed[static_cast<size_t>(i)], slot, document++, out);
      slot += lengths[static_cast<size_t>(i)];
    }
    if (!packing) continue;
    for (int32_t position = 0; slot < row_end; ++slot) {  // padding: its own document
      out.documents[static_cast<size_t>(slot)] = document;
      out.positions[static_cast<size_t>(slot)] = position++;
    }
  }
  out.rows += static_cast<int>(rows);
  out.filled_rows += filled;
  return rows;
}

}  // namespace

RolloutRows make_rollout_rows(const std::vector<RolloutGroup>& groups, const config::GrpoConfig& grpo, int max_rows,
                              int seq, int64_t row_unit) {
  RolloutRows out;
  out.seq = seq;
  std::vector<RolloutGroup> shaped = groups;  // rewards shaped and truncated samples filtered, as asked
  std::vector<Placed> placed;
  bool first = true;
  for (size_t gi = 0; gi < shaped.size(); ++gi) {
    RolloutGroup& group = shaped[gi];
    for (size_t si = 0; si < group.samples.size(); ++si) check_sample(group.samples[si], gi, si, seq);
    if (grpo.overlong_buffer > 0) {
      shape_overlong_rewards(group, grpo.overlong_max_tokens, grpo.overlong_buffer, grpo.overlong_penalty);
    }
    std::vector<double> rewards;
    for (const Rollout& s : group.samples) rewards.push_back(s.reward);
    const GroupAdvantages a = group_advantages(rewards, AdvantageOptions::from_config(grpo));
    out.zero_variance_groups += a.zero_variance ? 1 : 0;
    if (grpo.overlong_filter) out.filtered_samples += filter_overlong(group);
    for (size_t si = 0; si < group.samples.size(); ++si) {
      const double r = rewards[si];
      out.reward_sum += r;
      out.reward_min = first ? r : std::min(out.reward_min, r);
      out.reward_max = first ? r : std::max(out.reward_max, r);
      first = false;
      ++out.samples;
      placed.push_back({&group.samples[si], a.advantages[si], trained_targets_of(group.samples[si])});
    }
  }
  // The updates' shares of the samples, in order, their sizes differing by at most one.
  const int updates = grpo.minibatches;
  LOOM_CHECK(out.samples >= updates, "grpo.minibatches = " + std::to_string(updates) +
                                         " updates a step, each on a share of its samples, and this step has " +
                                         std::to_string(out.samples) + ": lower grpo.minibatches");
  int64_t used = 0;
  for (int m = 0; m < updates; ++m) {
    const int64_t from = out.samples * m / updates, to = out.samples * (m + 1) / updates;
    const std::span<const Placed> share(placed.begin() + from, placed.begin() + to);
    RolloutMinibatch minibatch;
    for (const Placed& p : share) {
      minibatch.trained_targets += p.trained_targets;
      minibatch.trained_samples += p.trained_targets > 0 ? 1 : 0;
      used += static_cast<int64_t>(p.sample->tokens.size()) - 1;
    }
    minibatch.rows = lay_out(share, grpo.packing, max_rows, row_unit, updates, out);
    out.minibatches.push_back(minibatch);
  }
  out.packing_efficiency = static_cast<double>(used) / (static_cast<double>(out.rows) * out.seq);
  return out;
}

void RolloutSource::set(RolloutRows rows, int64_t first_sample, int passes) {
  rows_ = std::move(rows);
  first_sample_ = first_sample;
  passes_ = passes;
}

void RolloutSource::fill(int64_t first, train::TokenBatch& batch) const {
  const int64_t offset = first - first_sample_, rows = rows_.rows;
  const int64_t row0 = rows > 0 ? offset % rows : offset;  // the pass's row
  LOOM_CHECK(offset >= 0 && offset < rows * passes_ && row0 + batch.batch <= rows && batch.seq == rows_.seq,
             "GRPO rollouts: samples [" + std::to_string(first) + ", " + std::to_string(first + batch.batch) +
                 ") asked of a step holding [" + std::to_string(first_sample_) + ", " +
                 std::to_string(first_sample_ + rows * passes_) + ")" +
                 (passes_ > 1 ? " (" + std::to_string(passes_) + " passes over " + std::to_string(rows) + " rows)"
                              : ""));
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
  slice(rows_.sample_targets, batch.sample_targets);
  if (!rows_.documents.empty()) {  // packed samples (else plain rows, as TokenBatch::resize left them)
    slice(rows_.positions, batch.positions);
    slice(rows_.documents, batch.documents);
  }
}

}  // namespace loom::rl
