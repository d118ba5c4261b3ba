// Engine::draft_step: speculative decoding's drafts from the model's multi-token prediction
// depths, as training computes them (model/multi_token_prediction.h). Depth k at position t reads
// the token k positions ahead and depth k - 1's output at t (depth 1: the main model's, after its
// final norm), and attends over its own keys and values of the positions before.
//
// After a step's forward and the tokens it kept, a sample knows tokens 0 .. m and the main model
// has computed positions 0 .. T - 1 (T = m once it decodes). Depth k's row at t is known when
// t < T and t + k <= m: each step runs depth k over the rows from the first it had not computed so
// to the last known one (kept for good), and, for a decoding sample, on to position m - 1 with
// the tokens drafted by the depths before it (rows that the next steps compute again once those
// tokens are known). Depth k's logits at m - 1 give the draft of position m + k. Depth k - 1's rows
// of a step start at most one position after depth k's: its output at that position, computed the
// step before, is kept per sample (one of the two kept states of its slot: a step writes the
// other, which its next step reads).
#include <algorithm>

#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/infer/engine.h"
#include "loom/infer/speculative.h"

namespace loom::infer {

namespace {
// Whether a sample decodes: it has sampled a token, which the main model computes next (its
// prompt's chunks stop short of the prompt's end at times, where no token is sampled yet).
template <typename Sample>
bool decoding(const Sample& s) {
  return s.generated > 0 && s.computed + 1 == static_cast<int64_t>(s.tokens.size());
}
}  // namespace

std::vector<Engine::Drafter> Engine::step_drafters() {
  const int depths = options_.speculative_tokens;
  std::vector<Drafter> drafters;
  for (auto& r : running_) {
    for (auto& sample : r->samples) {
      Sample& s = *sample;
      if (s.step_row < 0 || s.finished) continue;
      if (s.depth_done.empty()) {
        s.depth_done.assign(static_cast<size_t>(depths), 0);
        s.kept_half.assign(static_cast<size_t>(depths - 1), 0);
      }
      const int64_t last = static_cast<int64_t>(s.tokens.size()) - 1;
      int64_t count = 0;
      if (decoding(s)) {  // drafts that the request's length, the context and a step's rows leave room for
        count = std::min<int64_t>({depths, r->options.max_tokens - s.generated - 1, model_.max_seq_len - 1 - last,
                                   options_.max_batch_tokens - 1});
        if (count <= 0) continue;  // never again: one token left, or one row a step
      }
      drafters.push_back({&s, static_cast<int>(count), {}, {}});
    }
  }
  return drafters;
}

void Engine::add_depth_rows(model::DraftBatch& draft, Drafter& d, int32_t entry) {
  Sample& s = *d.sample;
  const int k = draft.depth;
  const int64_t last = static_cast<int64_t>(s.tokens.size()) - 1;
  const bool decodes = decoding(s);
  int64_t& done = s.depth_done[static_cast<size_t>(k - 1)];
  const int64_t known_end = std::min(s.computed, last - k + 1);  // rows from known tokens end here
  const int64_t end = decodes ? last : known_end;
  const DepthRows before = d.rows;  // depth k - 1's rows of this step
  d.rows = {done, -1};
  if (done >= end) return;
  d.rows.first_row = draft.rows.rows();
  for (int64_t t = done; t < end; ++t) {
    const int64_t ahead = t + k;
    LOOM_CHECK(ahead <= last + static_cast<int64_t>(s.drafts.size()),
               "drafting: depth " + std::to_string(k) + " at position " + std::to_string(t) +
                   " reads a token not drafted yet (position " + std::to_string(ahead) + ")");
    draft.rows.tokens.push_back(ahead <= last ? s.tokens[static_cast<size_t>(ahead)]
                                              : s.drafts[static_cast<size_t>(ahead - last - 1)]);
    draft.rows.positions.push_back(static_cast<int32_t>(t));
    draft.rows.sequences.push_back(entry);
    int32_t hidden = 0;
    if (k == 1) {
      LOOM_CHECK(t >= s.step_position && t < s.computed,
                 "drafting: position " + std::to_string(t) + " has no row in the step's forward");
      hidden = static_cast<int32_t>(s.step_row + t - s.step_position);
    } else if (before.first_row >= 0 && t >= before.first_position) {
      hidden = static_cast<int32_t>(before.first_row + t - before.first_position);
    } else {
      LOOM_CHECK(t == before.first_position - 1 && s.slot >= 0,
                 "drafting: depth " + std::to_string(k - 1) + " kept no state at position " + std::to_string(t));
      hidden = -1 - (2 * s.slot + s.kept_half[static_cast<size_t>(k - 2)]);
    }
    draft.hidden_rows.push_back(hidden);
  }
  if (decodes) draft.rows.logit_rows.push_back(draft.rows.rows() - 1);
  if (k < options_.speculative_tokens && known_end > done) {  // into the state depth k + 1 does not read now
    draft.retain_rows.push_back(static_cast<int32_t>(d.rows.first_row + known_end - 1 - done));
    draft.retain_states.push_back(2 * s.slot + 1 - s.kept_half[static_cast<size_t>(k - 1)]);
    d.kept_written.push_back(k);
  }
  done = known_end;
}

void Engine::take_draft(Sample& s, int depth, const float* logits) {
  if (options_.draft_observer) {
    std::vector<int32_t> before = s.tokens;
    before.insert(before.end(), s.drafts.begin(), s.drafts.end());
    options_.draft_observer(before, depth, logits);
  }
  model::TokenDistribution from = model::token_distribution(logits, sampled_vocab_, s.request->options.sampling);
  const uint64_t counter = draw_counter(s, static_cast<int64_t>(s.drafts.size()));
  s.drafts.push_back(model::draw_token(from, philox_uniform(s.request->key, counter, kDraftStream)));
  s.draft_distributions.push_back(std::move(from));
}

void Engine::draft_step() {
  std::vector<Drafter> drafters = step_drafters();
  for (int k = 1; k <= options_.speculative_tokens; ++k) {
    model::DraftBatch draft;
    draft.depth = k;
    std::vector<Sample*> entries, drafting;  // the samples with rows, and those drafting (a logit row each)
    for (Drafter& d : drafters) {
      Sample& s = *d.sample;
      if (decoding(s) && d.drafts < k) continue;  // drafts no deeper: its depth k rows are never read
      const auto first_logit = draft.rows.logit_rows.size();
      add_depth_rows(draft, d, static_cast<int32_t>(entries.size()));
      if (d.rows.first_row < 0) continue;  // nothing new at this depth
      entries.push_back(&s);
      if (draft.rows.logit_rows.size() > first_logit) drafting.push_back(&s);
    }
    if (entries.empty()) continue;
    set_block_tables(draft.rows, entries);
    const float* logits = runner_->draft(draft);
    for (size_t j = 0; j < drafting.size(); ++j) take_draft(*drafting[j], k, logits + j * model_.vocab_size);
  }
  for (Drafter& d : drafters) {  // the states written this step are the ones to read next
    for (int k : d.kept_written) d.sample->kept_half[static_cast<size_t>(k - 1)] ^= 1;
  }
  for (auto& r : running_) {
    for (auto& sample : r->samples) sample->step_row = -1;
  }
}

}  // namespace loom::infer
