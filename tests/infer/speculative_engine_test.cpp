// Speculative decoding with the model's multi-token prediction depths (EngineOptions::
// speculative_tokens): every draft is the depth's prediction as training computes it over the
// tokens before it, greedy output is the target's greedy output token for token, a hybrid model's
// Mamba state is restored after refused drafts, and the engine returns every block and slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_support.h"
#include "loom/core/error.h"
#include "loom/kernels/types.h"

namespace loom::infer::testing {
namespace {

// Depth k's logits at the last known position from training's forward over the tokens before the
// draft (known tokens, then the drafts of depths 1 .. k - 1): depth k at position m - 1 reads the
// token k ahead, the last of `before`.
std::vector<float> training_draft_logits(model::Transformer& model, const std::vector<int32_t>& before, int depth) {
  const auto seq = static_cast<int64_t>(before.size());
  const std::vector<int32_t> targets(before.size(), kernels::kIgnoreIndex);
  model::Activations a;
  model.forward_chunk(a, 0, before.data(), targets.data(), 1, seq, 0.0f);
  const int64_t V = model.config().vocab_size, row = seq - 1 - depth;
  const float* logits = a.mtp[static_cast<size_t>(depth - 1)].logits.data() + row * V;
  return std::vector<float>(logits, logits + V);
}

struct DraftCheck {
  int64_t drafts = 0;
  double worst = 0.0;  // the largest |logit difference| over every draft
};

struct Case {
  std::string model;
  int tokens;
};

TEST(SpeculativeDecoding, GreedyOutputIsTheTargetsAndEveryDraftIsTrainingsDepth) {
  for (const Case& c : {Case{"llama_mtp", 1}, Case{"llama_mtp", 3}, Case{"gpt2_mtp", 2}, Case{"hybrid_mtp", 2}}) {
    const std::string what = c.model + " drafting " + std::to_string(c.tokens);
    const std::string ckpt = checkpoint_of(c.model);
    const auto prompts = prompts_of({3, 11, 17, 26});
    Engine plain(ckpt, {});
    const auto expected = run_all(plain, prompts, greedy(24));
    EngineOptions options;
    options.speculative_tokens = c.tokens;
    DraftCheck check;
    std::unique_ptr<model::Transformer> model = load_model(ckpt);
    options.draft_observer = [&](const std::vector<int32_t>& before, int depth, const float* logits) {
      const std::vector<float> reference = training_draft_logits(*model, before, depth);
      for (size_t v = 0; v < reference.size(); ++v) {
        check.worst = std::max(check.worst, static_cast<double>(std::abs(logits[v] - reference[v])));
      }
      ++check.drafts;
      double w = 0; for (size_t v = 0; v < reference.size(); ++v) w = std::max(w, (double)std::abs(logits[v] - reference[v]));
      if (getenv("DBG")) fprintf(stderr, "depth %d len %zu worst %g\n", depth, before.size(), w);
    };
    Engine engine(ckpt, options);
    const auto got = run_all(engine, prompts, greedy(24));
    for (size_t i = 0; i < prompts.size(); ++i) expect_same(got[i][0], expected[i][0], what + ", prompt " + std::to_string(i));
    EXPECT_GT(check.drafts, 0) << what;
    EXPECT_LT(check.worst, 1e-4) << what;
    const EngineMetrics& m = engine.metrics();
    // Trained on repetitive text, the depths are often right and sometimes wrong: both paths ran.
    EXPECT_GT(m.spec_accepted_tokens.load(), 0) << what;
    EXPECT_LT(m.spec_accepted_tokens.load(), m.spec_draft_tokens.load()) << what;
    // Fewer forwards than tokens: kept drafts save steps.
    EXPECT_LT(m.spec_verifications.load(), m.generation_tokens.load()) << what;
    EXPECT_EQ(engine.blocks().used_blocks(), 0) << what;
    EXPECT_EQ(engine.free_state_slots(), engine.state_slots()) << what;
  }
}

}  // namespace
}  // namespace loom::infer::testing
