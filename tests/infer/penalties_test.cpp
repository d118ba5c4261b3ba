// Presence, frequency and repetition penalties (infer/penalties.h): the row transform by hand, and
// the engine's greedy output under them against a reference that takes training's forward logits
// at every step and applies the penalties itself (also for forked samples, and with the model's
// drafting depths, whose greedy output must stay the target's).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "engine_support.h"
#include "loom/core/error.h"
#include "loom/infer/generate.h"
#include "loom/infer/penalties.h"
#include "loom/kernels/types.h"

namespace loom::infer::testing {
namespace {

// Prompt ids {0, 4}; output counts {1: 2, 3: 1}; presence 0.5, frequency 0.25, repetition 2:
// the repetition divides or multiplies ids 0, 4 (prompt) and 1, 3 (output) by 2, then the
// output's ids lose 0.25 x count + 0.5.
TEST(Penalties, OfARowByHand) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f};
  const Penalties penalties{0.5, 0.25, 2.0};
  PenaltyCounts counts(penalties, {4, 0, 4});
  counts.add_output(1);
  counts.add_output(3);
  counts.add_output(1);
  std::vector<float> out(5);
  apply_penalties(logits.data(), 5, penalties, counts, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -3.0f, 0.5f, 0.75f, -4.0f}));
  std::vector<float> in_place = logits;
  apply_penalties(in_place.data(), 5, penalties, counts, in_place.data());
  EXPECT_EQ(in_place, out);
  EXPECT_TRUE(penalties.active());
  EXPECT_FALSE(Penalties{}.active());
  const Penalties negative{-1.0, 0.0, 1.0};  // a negative presence penalty favours repeats
  apply_penalties(logits.data(), 5, negative, counts, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.0f, 0.0f, 0.5f, 4.0f, -2.0f}));
}

// Training's forward over `tokens`: the main head's logits at the last position.
std::vector<float> last_logits(model::Transformer& model, const std::vector<int32_t>& tokens) {
  const auto seq = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> targets(tokens.size(), kernels::kIgnoreIndex);
  model::Activations a;
  model.forward_chunk(a, 0, tokens.data(), targets.data(), 1, seq, 0.0f);
  const int64_t V = model.config().vocab_size;
  const float* row = a.logits.data() + (seq - 1) * V;
  return std::vector<float>(row, row + V);
}

// Greedy decoding of `max_tokens` with the penalties applied here, independently of the engine.
std::vector<int32_t> reference_greedy(model::Transformer& model, const std::vector<int32_t>& prompt, int64_t max_tokens,
                                      int64_t vocab, const Penalties& p) {
  std::vector<int32_t> tokens = prompt, out;
  std::map<int32_t, int> count;
  const std::set<int32_t> in_prompt(prompt.begin(), prompt.end());
  for (int64_t k = 0; k < max_tokens; ++k) {
    std::vector<float> z = last_logits(model, tokens);
    for (int32_t id = 0; id < vocab; ++id) {
      const bool seen = in_prompt.count(id) != 0 || count.count(id) != 0;
      if (seen && p.repetition != 1.0) z[id] = z[id] > 0.0f ? z[id] / p.repetition : z[id] * p.repetition;
      if (count.count(id) != 0) z[id] -= static_cast<float>(p.frequency * count[id] + p.presence);
    }
    const auto next = static_cast<int32_t>(std::max_element(z.begin(), z.begin() + vocab) - z.begin());
    out.push_back(next);
    tokens.push_back(next);
    ++count[next];
  }
  return out;
}

void expect_greedy_under_penalties(const std::string& ckpt, const EngineOptions& engine_options) {
  std::unique_ptr<model::Transformer> model = load_model(ckpt);
  const auto prompts = prompts_of({5, 12});
  for (const Penalties& p : {Penalties{1.5, 1.0, 1.0}, Penalties{0.0, 0.0, 1.8}, Penalties{0.4, 0.3, 1.3}}) {
    SCOPED_TRACE("presence " + std::to_string(p.presence) + " frequency " + std::to_string(p.frequency) +
                 " repetition " + std::to_string(p.repetition));
    RequestOptions options = greedy(14);
    options.penalties = p;
    options.n = 2;  // the second sample is forked from the first after the prompt
    Engine engine(ckpt, engine_options);
    const auto got = run_all(engine, prompts, options);
    const auto plain = run_all(engine, prompts, greedy(14));
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int32_t> expected = reference_greedy(*model, prompts[i], 14, engine.sampled_vocab(), p);
      EXPECT_EQ(got[i][0].tokens, expected) << "prompt " << i;
      EXPECT_EQ(got[i][1].tokens, expected) << "prompt " << i << ", forked sample";
      EXPECT_NE(got[i][0].tokens, plain[i][0].tokens) << "prompt " << i << ": the penalties changed nothing";
    }
  }
}

// The model trained 60 steps (its depths unused here): the 2-step one's greedy output hardly
// repeats a token, so penalties would change nothing to check.
TEST(Penalties, GreedyOutputIsTheReferencesUnderEachPenalty) {
  expect_greedy_under_penalties(checkpoint_of("llama_mtp"), {});
}

// With two drafts a step from the model's depths: the drafts are drawn without the penalties and
// verified against the penalised target, so the greedy output is still the reference's.
TEST(Penalties, DraftingDepthsKeepTheGreedyOutput) {
  EngineOptions options;
  options.speculative_tokens = 2;
  expect_greedy_under_penalties(checkpoint_of("llama_mtp"), options);
}

// `loom generate`'s path (Generator, its own KV cache): the same greedy output as the reference.
TEST(Penalties, GenerateDrawsUnderThemToo) {
  const std::string ckpt = checkpoint_of("llama_mtp");
  std::unique_ptr<model::Transformer> model = load_model(ckpt);
  Generator generator(ckpt);
  for (const Penalties& p : {Penalties{1.5, 1.0, 1.0}, Penalties{0.4, 0.3, 1.3}}) {
    GenerateOptions options;
    options.prompt = "the cat sat";
    options.max_tokens = 14;
    options.sampling.temperature = 0.0;
    options.stop_at_eot = false;
    options.penalties = p;
    const std::vector<int32_t> prompt = generator.tokenizer().encode(options.prompt);
    const std::vector<int32_t> expected =
        reference_greedy(*model, prompt, 14, generator.tokenizer().vocab_size(), p);
    EXPECT_EQ(generator.continue_text(options), generator.tokenizer().decode(expected));
    options.penalties = {};
    EXPECT_NE(generator.continue_text(options), generator.tokenizer().decode(expected));
  }
}

TEST(Penalties, OutOfRangeValuesAreRefusedByName) {
  Engine engine(checkpoint_of("llama"), {});
  for (const auto& [penalties, name] : {std::pair{Penalties{2.5, 0.0, 1.0}, "presence_penalty"},
                                        std::pair{Penalties{0.0, -3.0, 1.0}, "frequency_penalty"},
                                        std::pair{Penalties{0.0, 0.0, 0.0}, "repetition_penalty"}}) {
    RequestOptions options = greedy(4);
    options.penalties = penalties;
    try {
      engine.submit({1, 2, 3}, options);
      ADD_FAILURE() << "accepted " << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace loom::infer::testing
