// The engine against one sequence at a time and against a full forward: batching, chunked
// prefill, prefix sharing, n samples and tensor parallelism change nothing in the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "engine_support.h"
#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "loom/core/trace.h"

namespace loom::infer::testing {
namespace {

class EngineTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineTest, BatchEqualsEachAloneAndFullForward) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({3, 9, 17, 30});
  Engine batched(ckpt, {});
  const auto together = run_all(batched, prompts, greedy(10));
  for (size_t i = 0; i < prompts.size(); ++i) {
    Engine alone(ckpt, {});
    const auto single = run_all(alone, {prompts[i]}, greedy(10));
    expect_same(together[i][0], single[0][0], "prompt " + std::to_string(i));
    EXPECT_EQ(together[i][0].finish_reason, "length");
    const std::vector<float> reference = full_forward_logprobs(ckpt, prompts[i], together[i][0].tokens);
    expect_same(together[i][0], {together[i][0].tokens, reference, "", ""}, "full forward, prompt " + std::to_string(i));
  }
  EXPECT_EQ(batched.blocks().used_blocks(), 0);
  EXPECT_EQ(batched.free_state_slots(), batched.state_slots());
}

TEST_P(EngineTest, ChunkedPrefillAndPrefixSharingChangeNothing) {
  const std::string ckpt = checkpoint_of(GetParam());
  auto prompts = prompts_of({21, 21, 7, 26});
  prompts[1] = prompts[0];
  prompts[1].back() = 'x';                                          // same first 20 tokens
  prompts[3].assign(prompts[0].begin(), prompts[0].begin() + 16);  // a prefix of whole blocks
  for (int k = 0; k < 10; ++k) prompts[3].push_back('a' + k);
  EngineOptions plain;
  plain.prefix_caching = false;
  Engine reference(ckpt, plain);
  const auto expected = run_all(reference, prompts, greedy(8));
  EngineOptions chunked;
  chunked.block_size = 4;
  chunked.max_batch_tokens = 5;  // every prompt arrives in chunks
  Engine engine(ckpt, chunked);
  const auto got = run_all(engine, prompts, greedy(8));
  for (size_t i = 0; i < prompts.size(); ++i) expect_same(got[i][0], expected[i][0], "prompt " + std::to_string(i));
  // A hybrid model's Mamba state exists only where a prompt's computation stopped: no prefix reuse.
  if (engine.state_slots() == 0) {
    EXPECT_GT(engine.metrics().cached_prompt_tokens.load(), 0);
  } else {
    EXPECT_EQ(engine.metrics().cached_prompt_tokens.load(), 0);
  }
  EXPECT_EQ(engine.blocks().used_blocks(), 0);
}

TEST_P(EngineTest, SamplesOfOnePromptShareItsBlocks) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({13});
  EngineOptions options;
  options.block_size = 4;
  Engine engine(ckpt, options);
  const auto one = run_all(engine, prompts, greedy(6));
  RequestOptions four = greedy(6);
  four.n = 4;
  const auto many = run_all(engine, prompts, four);
  for (int k = 0; k < 4; ++k) expect_same(many[0][k], one[0][0], "sample " + std::to_string(k));
  EXPECT_EQ(engine.blocks().used_blocks(), 0);
  // Seeded sampling: reproducible, and the samples draw differently.
  RequestOptions sampled;
  sampled.sampling = {.temperature = 1.0, .top_k = 50, .top_p = 0.95, .min_p = 0.01};
  sampled.seed = 42;
  sampled.max_tokens = 12;
  sampled.n = 3;
  sampled.ignore_eos = true;
  const auto a = run_all(engine, prompts, sampled);
  const auto b = run_all(engine, prompts, sampled);
  for (int k = 0; k < 3; ++k) expect_same(a[0][k], b[0][k], "seeded sample " + std::to_string(k));
  EXPECT_FALSE(a[0][0].tokens == a[0][1].tokens && a[0][1].tokens == a[0][2].tokens);
}

TEST_P(EngineTest, TensorParallelEqualsOneRank) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({5, 18, 11});
  Engine one(ckpt, {});
  EngineOptions tp2;
  tp2.tp = 2;
  tp2.max_batch_tokens = 8;
  Engine two(ckpt, tp2);
  RequestOptions o = greedy(8);
  o.n = 2;
  const auto expected = run_all(one, prompts, o);
  const auto got = run_all(two, prompts, o);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int k = 0; k < 2; ++k) expect_same(got[i][k], expected[i][k], "prompt " + std::to_string(i));
  }
  EXPECT_EQ(two.blocks().used_blocks(), 0);
  EXPECT_EQ(two.free_state_slots(), two.state_slots());
}

// The weights an engine holds, gathered over its tensor-parallel ranks, have the digest of the
// checkpoint they were loaded from (what a trainer checks after a refit).
TEST_P(EngineTest, WeightsDigestIsTheCheckpointsAtEveryTp) {
  const std::string ckpt = checkpoint_of(GetParam());
  const std::string expected = ckpt::parameter_digest(ckpt);
  for (int tp : {1, 2}) {
    EngineOptions options;
    options.tp = tp;
    Engine engine(ckpt, options);
    std::thread loop([&] { engine.run(); });
    const auto [digest, version] = engine.weights_digest();
    engine.stop(true);
    loop.join();
    EXPECT_EQ(digest, expected) << "tp " << tp;
    EXPECT_FALSE(version.empty());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineTest, ::testing::Values("llama", "gpt2", "moe", "hybrid"));

}  // namespace
}  // namespace loom::infer::testing

namespace loom::infer::testing {
namespace {

// Each open as its name, each close as "-".
class RangeRecorder : public trace::Sink {
 public:
  void open(const char* name) noexcept override { calls.push_back(name); }
  void close() noexcept override { calls.push_back("-"); }
  std::vector<std::string> calls;
};

// What a profiler hears from a serving step (core/trace.h): the step, its forward with each
// block inside, its sampling, under fixed names.
TEST(EngineTrace, AStepNamesItsForwardItsBlocksAndItsSampling) {
  const std::string ckpt = checkpoint_of("llama");
  Engine engine(ckpt, {});
  RangeRecorder recorder;
  {
    // Installed for the engine's steps only, even if they throw.
    struct Installed {
      explicit Installed(trace::Sink* sink) { trace::set_thread_sink(sink); }
      ~Installed() { trace::set_thread_sink(nullptr); }
    } installed(&recorder);
    run_all(engine, prompts_of({5}), greedy(2));
  }
  // The test model's 4 blocks.
  const std::vector<std::string> expected = {"engine step",           "engine forward", "block 0 paged forward", "-",
                                             "block 1 paged forward", "-",              "block 2 paged forward", "-",
                                             "block 3 paged forward", "-",              "-",
                                             "engine sampling",       "-",              "-"};
  ASSERT_GE(recorder.calls.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(recorder.calls.begin(), recorder.calls.begin() + expected.size()), expected);
  EXPECT_EQ(std::count(recorder.calls.begin(), recorder.calls.end(), "engine step"), engine.metrics().steps.load());
}

}  // namespace
}  // namespace loom::infer::testing
