// The engine on a hybrid model (Mamba-2, attention, MLP and MoE layers): each sample's Mamba
// state slot carries its recurrence through chunked prefill and decoding, joins and leaves of the
// batch, cancellation and the n samples of a prompt, so every output equals one sequence alone,
// `loom generate`'s decode path and a full forward.
#include <gtest/gtest.h>

#include "engine_support.h"
#include "loom/core/error.h"
#include "loom/infer/logprobs.h"
#include "loom/infer/sampling.h"

namespace loom::infer::testing {
namespace {

// Greedy tokens and their log-probabilities through Transformer::decode (`loom generate`'s path:
// one sequence, its own recurrent state and KV cache).
Completion generate_path(model::Transformer& model, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  model::DecodeState state;
  const float* logits = model.decode(state, prompt.data(), static_cast<int64_t>(prompt.size()));
  const int64_t V = model.config().vocab_size;
  Completion out;
  for (int64_t i = 0; i < max_tokens; ++i) {
    int32_t next = model::sample_token(logits, V, {.temperature = 0.0}, 0, 0);
    out.tokens.push_back(next);
    out.logprobs.push_back(token_logprobs(logits, V, next, 0).logprob);
    if (i + 1 < max_tokens) logits = model.decode(state, &next, 1);
  }
  return out;
}

TEST(HybridEngine, EqualsTheGeneratePath) {
  const std::string ckpt = checkpoint_of("hybrid");
  std::unique_ptr<model::Transformer> model = load_model(ckpt);
  ASSERT_EQ(model->config().vocab_size, 256);  // the byte tokenizer: every id is sampled
  const auto prompts = prompts_of({2, 9, 17, 30});
  Engine engine(ckpt, {});
  EXPECT_GT(engine.state_slots(), 0);
  const auto got = run_all(engine, prompts, greedy(12));
  for (size_t i = 0; i < prompts.size(); ++i) {
    expect_same(got[i][0], generate_path(*model, prompts[i], 12), "prompt " + std::to_string(i));
  }
  EXPECT_EQ(engine.free_state_slots(), engine.state_slots());
}

// Chunks that split the prompts unevenly (3 and 7 rows a step, fewer than the decoding
// sequences need at times): each chunk goes on from the state the previous one left.
TEST(HybridEngine, UnevenChunkedPrefillEqualsUnchunked) {
  const std::string ckpt = checkpoint_of("hybrid");
  const auto prompts = prompts_of({10, 17, 23, 4});
  Engine reference(ckpt, {});
  const auto expected = run_all(reference, prompts, greedy(7));
  for (int64_t chunk : {3, 7}) {
    EngineOptions options;
    options.block_size = 4;
    options.max_batch_tokens = chunk;
    Engine engine(ckpt, options);
    const auto got = run_all(engine, prompts, greedy(7));
    for (size_t i = 0; i < prompts.size(); ++i) {
      expect_same(got[i][0], expected[i][0], "chunk " + std::to_string(chunk) + ", prompt " + std::to_string(i));
    }
    EXPECT_EQ(engine.free_state_slots(), engine.state_slots());
  }
}

// Requests arriving while others decode, and one leaving early: everyone keeps their own state.
TEST(HybridEngine, SequencesJoiningAndLeavingKeepTheirState) {
  const std::string ckpt = checkpoint_of("hybrid");
  const auto prompts = prompts_of({12, 7, 25});
  const std::vector<int64_t> lengths{20, 4, 10};
  Engine engine(ckpt, {});
  std::vector<std::shared_ptr<RequestStream>> streams;
  std::vector<std::vector<Completion>> got(prompts.size(), std::vector<Completion>(1));
  auto step = [&](int times) {
    bool stepped = false;
    for (int k = 0; k < times; ++k) {
      stepped = engine.step();
      for (size_t r = 0; r < streams.size(); ++r) drain_stream(*streams[r], got[r]);
    }
    return stepped;
  };
  streams.push_back(engine.submit(prompts[0], greedy(lengths[0])));
  step(3);
  streams.push_back(engine.submit(prompts[1], greedy(lengths[1])));
  step(2);
  streams.push_back(engine.submit(prompts[2], greedy(lengths[2])));
  step(2);
  EXPECT_EQ(got[1][0].finish_reason, "length");  // left while the others go on
  EXPECT_EQ(engine.running(), 2);
  while (step(1)) {
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine alone(ckpt, {});
    expect_same(got[i][0], run_all(alone, {prompts[i]}, greedy(lengths[i]))[0][0], "prompt " + std::to_string(i));
  }
  EXPECT_EQ(engine.free_state_slots(), engine.state_slots());
}

// One slot only: a cancelled sequence's slot goes to the next one, which starts from a zero
// state (its output equals a fresh engine's).
TEST(HybridEngine, CancelledSlotIsReusedWithoutItsState) {
  const std::string ckpt = checkpoint_of("hybrid");
  const auto prompts = prompts_of({15, 11});
  EngineOptions one_slot;
  one_slot.max_running = 1;
  Engine engine(ckpt, one_slot);
  ASSERT_EQ(engine.state_slots(), 1);
  auto first = engine.submit(prompts[0], greedy(30));
  for (int k = 0; k < 5; ++k) engine.step();
  EXPECT_EQ(engine.free_state_slots(), 0);
  first->cancel();
  const auto after = run_all(engine, {prompts[1]}, greedy(9));
  Engine fresh(ckpt, one_slot);
  expect_same(after[0][0], run_all(fresh, {prompts[1]}, greedy(9))[0][0], "after a cancelled sequence");
  std::vector<Completion> cancelled(1);
  drain_stream(*first, cancelled);
  EXPECT_EQ(cancelled[0].finish_reason, "abort");
  EXPECT_TRUE(first->done());
  EXPECT_EQ(engine.free_state_slots(), 1);
  EXPECT_EQ(engine.metrics().state_slots_in_use.load(), 0);
}

// n = 2 sampled continuations of one prompt: each starts from a copy of the prompt's final
// state, so each sample's log-probabilities equal a full forward over prompt + its own tokens.
TEST(HybridEngine, SamplesContinueFromThePromptsState) {
  const std::string ckpt = checkpoint_of("hybrid");
  const auto prompts = prompts_of({14});
  EngineOptions options;
  options.max_running = 2;  // both samples' slots: the pool has no spare
  Engine engine(ckpt, options);
  RequestOptions sampled;
  sampled.sampling = {.temperature = 1.0};
  sampled.seed = 3;
  sampled.max_tokens = 10;
  sampled.n = 2;
  sampled.ignore_eos = true;
  const auto got = run_all(engine, prompts, sampled);
  EXPECT_NE(got[0][0].tokens, got[0][1].tokens);
  for (int k = 0; k < 2; ++k) {
    const std::vector<float> reference = full_forward_logprobs(ckpt, prompts[0], got[0][k].tokens);
    expect_same(got[0][k], {got[0][k].tokens, reference, "", ""}, "sample " + std::to_string(k));
  }
  EXPECT_EQ(engine.free_state_slots(), 2);
}

// The state pool (one slot per running sample) comes out of the cache budget before KV blocks.
TEST(HybridEngine, StatePoolIsInTheMemoryBudget) {
  const std::string ckpt = checkpoint_of("hybrid");
  std::unique_ptr<model::Transformer> model = load_model(ckpt);
  const int64_t slot = model->paged_state_slot_bytes(), block = model->paged_block_bytes(4);
  EXPECT_EQ(slot, 2 * 4 * (3 * (32 + 2 * 2 * 8) + 4 * 8 * 8));  // 2 mixers: windows + states, fp32
  EngineOptions options;
  options.block_size = 4;
  options.max_running = 8;
  options.kv_cache_bytes = 8 * slot + 10 * block;
  Engine engine(ckpt, options);
  EXPECT_EQ(engine.blocks().blocks(), 10);
  EXPECT_EQ(engine.metrics().state_pool_bytes.load(), 8 * slot);
  EXPECT_EQ(engine.metrics().state_slots_total.load(), 8);
  options.kv_cache_bytes = 8 * slot;
  try {
    Engine too_small(ckpt, options);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-cache-mb"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::infer::testing
