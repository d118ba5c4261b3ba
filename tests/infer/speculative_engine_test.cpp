// Speculative decoding with the model's multi-token prediction depths (EngineOptions::
// speculative_tokens): every draft is the depth's prediction as training computes it over the
// tokens before it, greedy output is the target's greedy output token for token, a hybrid model's
// Mamba state is restored after refused drafts, and the engine returns every block and slot.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_support.h"
#include "loom/core/error.h"
#include "loom/infer/generate.h"
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

// Every draft's logits compared with training's depth over the same tokens.
struct DraftCheck {
  explicit DraftCheck(const std::string& ckpt) : model(load_model(ckpt)) {}
  void watch(EngineOptions& options) {
    options.draft_observer = [this](const std::vector<int32_t>& before, int depth, const float* logits) {
      const std::vector<float> reference = training_draft_logits(*model, before, depth);
      for (size_t v = 0; v < reference.size(); ++v) {
        worst = std::max(worst, static_cast<double>(std::abs(logits[v] - reference[v])));
      }
      ++drafts;
      deepest = std::max(deepest, depth);
    };
  }
  std::unique_ptr<model::Transformer> model;
  int64_t drafts = 0;
  int deepest = 0;
  double worst = 0.0;  // the largest |logit difference| over every draft
};

void expect_everything_returned(Engine& engine, const std::string& what) {
  EXPECT_EQ(engine.blocks().used_blocks(), 0) << what;
  EXPECT_EQ(engine.free_state_slots(), engine.state_slots()) << what;
}

// n samples of `max_tokens` tokens each, drawn at `temperature` with `seed`.
RequestOptions seeded(int64_t max_tokens, int n, uint64_t seed, double temperature) {
  RequestOptions o;
  o.max_tokens = max_tokens;
  o.n = n;
  o.seed = seed;
  o.ignore_eos = true;
  o.sampling.temperature = temperature;
  return o;
}

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
    DraftCheck check(ckpt);
    check.watch(options);
    Engine engine(ckpt, options);
    const auto got = run_all(engine, prompts, greedy(24));
    for (size_t i = 0; i < prompts.size(); ++i) {
      expect_same(got[i][0], expected[i][0], what + ", prompt " + std::to_string(i));
    }
    EXPECT_EQ(check.deepest, c.tokens) << what;
    EXPECT_LT(check.worst, 1e-4) << what;
    const EngineMetrics& m = engine.metrics();
    // Trained on repetitive text, the depths are often right and sometimes wrong: both paths ran.
    EXPECT_GT(m.spec_accepted_tokens.load(), 0) << what;
    EXPECT_LT(m.spec_accepted_tokens.load(), m.spec_draft_tokens.load()) << what;
    EXPECT_GE(m.spec_accepted_at[0].load(), m.spec_accepted_at[static_cast<size_t>(c.tokens - 1)].load()) << what;
    // Fewer steps than tokens: kept drafts save forwards.
    EXPECT_LT(m.spec_verifications.load() + static_cast<int64_t>(prompts.size()), m.generation_tokens.load()) << what;
    expect_everything_returned(engine, what);
  }
}

// Sampled (n samples of a prompt, which share its blocks), prompts in uneven chunks over small
// blocks, tensor parallelism: every draft is still training's depth over its own sample's tokens.
TEST(SpeculativeDecoding, DraftsFollowEachSampleThroughChunksForksAndTensorParallelism) {
  // Hot enough that a prompt's samples take different first tokens: their drafting rows at the
  // prompt's last positions differ.
  RequestOptions sampled = seeded(20, 3, 5, 2.0);
  sampled.sampling.top_k = 40;
  for (const std::string name : {"llama_mtp", "hybrid_mtp"}) {
    for (int tp : {1, 2}) {
      const std::string what = name + " at tp " + std::to_string(tp);
      const std::string ckpt = checkpoint_of(name);
      EngineOptions options;
      options.speculative_tokens = 2;
      options.block_size = 4;
      options.max_batch_tokens = 7;
      options.tp = tp;
      DraftCheck check(ckpt);
      check.watch(options);
      Engine engine(ckpt, options);
      const auto got = run_all(engine, prompts_of({9, 14, 5}), sampled);
      for (const auto& request : got) {
        for (const Completion& c : request) EXPECT_EQ(c.tokens.size(), 20u) << what;
      }
      EXPECT_GT(check.drafts, 0) << what;
      EXPECT_LT(check.worst, 1e-4) << what;
      EXPECT_GT(engine.metrics().spec_accepted_tokens.load(), 0) << what;
      expect_everything_returned(engine, what);
    }
  }
}

// Seeded sampling gives a request the same tokens alone as among others, also when a step's rows
// cannot hold every sample's drafts (7 rows, three samples drafting 2 each): a sample waits for a
// step with all its drafts rather than having them cut, which would change its draws.
TEST(SpeculativeDecoding, SeededSamplesAreTheSameAloneAndAmongOthersInFullSteps) {
  const RequestOptions sampled = seeded(24, 2, 11, 1.0);
  for (const std::string name : {"llama_mtp", "hybrid_mtp"}) {
    const std::string ckpt = checkpoint_of(name);
    EngineOptions options;
    options.speculative_tokens = 2;
    options.block_size = 4;
    options.max_batch_tokens = 7;
    Engine engine(ckpt, options);
    const auto prompts = prompts_of({5, 12, 8});
    const auto together = run_all(engine, prompts, sampled);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto alone = run_all(engine, {prompts[i]}, sampled);
      for (int c = 0; c < sampled.n; ++c) {
        expect_same(together[i][static_cast<size_t>(c)], alone[0][static_cast<size_t>(c)],
                    name + ", prompt " + std::to_string(i) + " sample " + std::to_string(c));
      }
    }
    EXPECT_GT(engine.metrics().spec_accepted_tokens.load(), 0) << name;
    EXPECT_LT(engine.metrics().spec_accepted_tokens.load(), engine.metrics().spec_draft_tokens.load()) << name;
    expect_everything_returned(engine, name);
  }
}

// The last tokens of a request and of the context: drafts never run past max_tokens or
// model.max_seq_len, and a stop token among kept drafts ends the sample there.
TEST(SpeculativeDecoding, DraftsStopAtTheRequestsAndTheContextsEnd) {
  const std::string ckpt = checkpoint_of("llama_mtp");
  Engine plain(ckpt, {});
  EngineOptions options;
  options.speculative_tokens = 3;
  Engine engine(ckpt, options);
  for (int64_t max_tokens : {1, 2, 3, 5}) {
    const auto prompts = prompts_of({6, 13});
    expect_same(run_all(engine, prompts, greedy(max_tokens))[1][0], run_all(plain, prompts, greedy(max_tokens))[1][0],
                "max_tokens " + std::to_string(max_tokens));
  }
  const auto near_the_end = prompts_of({59});  // the context is 64: 5 tokens left
  expect_same(run_all(engine, near_the_end, greedy(5))[0][0], run_all(plain, near_the_end, greedy(5))[0][0],
              "at the context's end");
  // A stop token: the greedy output's fourth token, wherever drafts put it.
  const auto prompts = prompts_of({11});
  const std::vector<int32_t> free_run = run_all(plain, prompts, greedy(12))[0][0].tokens;
  RequestOptions stopping = greedy(12);
  stopping.stop_token_ids = {free_run[3]};
  const Completion expected = run_all(plain, prompts, stopping)[0][0];
  const Completion got = run_all(engine, prompts, stopping)[0][0];
  expect_same(got, expected, "stop token");
  EXPECT_EQ(got.finish_reason, "stop");
  expect_everything_returned(engine, "after the stops");
}

TEST(SpeculativeDecoding, MoreDraftsThanDepthsAreRefusedByName) {
  EngineOptions options;
  options.speculative_tokens = 3;
  try {
    Engine engine(checkpoint_of("gpt2_mtp"), options);
    FAIL() << "3 drafts of a model with 2 depths were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_speculative_tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.mtp_depths"), std::string::npos) << e.what();
  }
  options.speculative_tokens = 1;
  EXPECT_THROW(Engine(checkpoint_of("llama"), options), Error);  // no depths at all
}

// loom generate with drafts (Generator's speculative_tokens, one sequence through the engine): the
// greedy text of the generator without drafts, for a dense model (three depths) and a hybrid one
// (two), one and two drafts a step, and cut at a stop string where that generator cuts it; more
// drafts than the model has depths is an error naming the key.
TEST(SpeculativeGenerate, GreedyTextIsTheGeneratorsWithoutDrafts) {
  for (const std::string name : {"llama_mtp", "hybrid_mtp"}) {
    const std::string ckpt = checkpoint_of(name);
    GenerateOptions options;
    options.prompt = "Once upon a time";
    options.max_tokens = 40;
    options.stop_at_eot = false;
    options.sampling.temperature = 0.0;  // greedy
    Generator plain(ckpt);
    const std::string expected = plain.continue_text(options);
    ASSERT_GE(expected.size(), 20u) << name;
    GenerateOptions stopping = options;
    stopping.stop = expected.substr(12, 3);
    const std::string cut = plain.continue_text(stopping);
    EXPECT_LT(cut.size(), expected.size()) << name;
    for (const int drafts : {1, 2}) {
      Generator drafting(ckpt, config::RuntimeDevice::Cpu, InferenceDtype::Auto, drafts);
      EXPECT_EQ(drafting.continue_text(options), expected) << name << ", " << drafts << " drafts";
      EXPECT_EQ(drafting.continue_text(stopping), cut) << name << ", " << drafts << " drafts";
      EXPECT_GT(drafting.drafts().drafted, 0) << name;  // the text did come through drafts
      EXPECT_GT(drafting.drafts().kept, 0) << name;
    }
  }
  // The generator's engine holds blocks for the whole context (EngineOptions::kv_cache_blocks):
  // 64 positions and 2 drafts in blocks of 16.
  EngineOptions sized;
  sized.kv_cache_blocks = 6;
  sized.speculative_tokens = 2;
  EXPECT_EQ(Engine(checkpoint_of("llama_mtp"), sized).blocks().blocks(), 6);
  try {
    Generator too_many(checkpoint_of("hybrid_mtp"), config::RuntimeDevice::Cpu, InferenceDtype::Auto, 3);
    ADD_FAILURE() << "3 drafts of a model with 2 depths";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.mtp_depths"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::infer::testing
