// The engine's GEMM dtype (EngineOptions::dtype, `loom serve --dtype`): bf16 and fp16 engines
// compute what the training path's forward does under that precision recipe, not the fp32 model;
// auto is fp32 on the cpu. Its KV cache's elements (EngineOptions::kv_cache_dtype): a bf16 cache
// holds twice the positions and moves the outputs by its rounding only. (On a device:
// device_engine_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_support.h"
#include "loom/core/error.h"

namespace loom::infer::testing {
namespace {

// How two runs' log-probabilities of the same tokens compare: the largest |a - b|, and how many
// agree to 2e-6 (a few ulps: the same roundings, summed in another order).
struct Agreement {
  float largest = 0.0f;
  int equal = 0, total = 0;
  void add(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      const float d = std::fabs(a[i] - b[i]);
      largest = std::max(largest, d);
      equal += d <= 2e-6f * std::max(1.0f, std::fabs(b[i])) ? 1 : 0;
      ++total;
    }
  }
};

class EngineDtypeTest : public ::testing::TestWithParam<std::string> {};

// Each completion's log-probabilities against one forward over prompt + completion under the
// engine's recipe, and under fp32: the first agree to 2e-6 but where a row's sums, batched
// otherwise, round to the other neighbour (rare), the second almost nowhere (an engine ignoring its
// dtype fails).
TEST_P(EngineDtypeTest, HalfPrecisionEnginesEqualTheTrainingForwardUnderTheirRecipe) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({5, 17, 30});
  for (auto [dtype, recipe] : {std::pair{InferenceDtype::Bf16, config::PrecisionRecipe::Bf16},
                               {InferenceDtype::Fp16, config::PrecisionRecipe::Fp16}}) {
    EngineOptions options;
    options.dtype = dtype;
    options.kv_cache_dtype = KvCacheSetting::Fp32;  // the training forward's keys and values are fp32
    options.block_size = 4;
    options.max_batch_tokens = 9;  // prompts in chunks beside decoding samples
    Engine engine(ckpt, options);
    EXPECT_EQ(engine.recipe(), recipe);
    const auto got = run_all(engine, prompts, greedy(8));
    Agreement own, fp32;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Completion& c = got[i][0];
      own.add(c.logprobs, full_forward_logprobs(ckpt, prompts[i], c.tokens, inference_policy(recipe)));
      fp32.add(c.logprobs, full_forward_logprobs(ckpt, prompts[i], c.tokens));
    }
    const std::string what = GetParam() + " " + config::to_string(dtype);
    std::printf("%s: to its recipe's forward %d of %d equal, largest difference %.3g; to fp32's %d equal, %.3g\n",
                what.c_str(), own.equal, own.total, own.largest, fp32.equal, fp32.largest);
    EXPECT_GE(own.equal, own.total * 9 / 10) << what;
    EXPECT_LT(own.largest, 1e-3f) << what;
    EXPECT_LE(fp32.equal, fp32.total / 4) << what;
  }
}

// A bf16 KV cache (`--kv-cache-dtype bf16`, fp32 GEMMs): twice the blocks in the same budget; the
// log-probabilities move from an fp32-cache engine's (batched alike, otherwise bit for bit the same
// computation) by the keys' and values' rounding only: some, and little; and batching and the
// forks of n samples (their partial blocks copied, half the bytes of an fp32 block) still change
// nothing.
TEST_P(EngineDtypeTest, Bf16KvCacheHoldsTwiceThePositionsAndChangesOnlyByItsRounding) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({5, 17, 30});
  EngineOptions fp32_cache;
  fp32_cache.block_size = 4;
  EngineOptions bf16_cache = fp32_cache;
  bf16_cache.kv_cache_dtype = KvCacheSetting::Bf16;
  Engine reference(ckpt, fp32_cache), engine(ckpt, bf16_cache);
  EXPECT_EQ(engine.kv_cache_dtype(), kernels::KvCacheDtype::Bf16);
  EXPECT_EQ(engine.recipe(), config::PrecisionRecipe::Fp32);
  // The same budget (less a hybrid model's fp32 state pool) over half the bytes per block:
  // floor(2 x / b) is 2 floor(x / b) or one more.
  const int64_t fp32_blocks = reference.blocks().blocks(), bf16_blocks = engine.blocks().blocks();
  EXPECT_GE(bf16_blocks, 2 * fp32_blocks);
  EXPECT_LE(bf16_blocks, 2 * fp32_blocks + 1);
  const auto expected = run_all(reference, prompts, greedy(8));
  const auto together = run_all(engine, prompts, greedy(8));
  int compared = 0, moved = 0;
  float largest = 0.0f;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Completion &got = together[i][0], &want = expected[i][0];
    // Up to the first token the rounding changes, if any (then the contexts differ).
    for (size_t t = 0; t < got.tokens.size() && t < want.tokens.size(); ++t) {
      ++compared;
      moved += got.logprobs[t] != want.logprobs[t] ? 1 : 0;
      largest = std::max(largest, std::fabs(got.logprobs[t] - want.logprobs[t]));
      if (got.tokens[t] != want.tokens[t]) break;
    }
    Engine alone(ckpt, bf16_cache);
    expect_same(got, run_all(alone, {prompts[i]}, greedy(8))[0][0], "prompt " + std::to_string(i));
  }
  std::printf("%s: bf16 KV cache against an fp32 one: %d of %d log-probabilities moved, at most %.3g\n",
              GetParam().c_str(), moved, compared, largest);
  EXPECT_GE(compared, 3);
  EXPECT_GT(moved, 0) << GetParam();
  EXPECT_LT(largest, 5e-3f) << GetParam();
  // n = 2 greedy samples of each prompt: both equal the single sample (forked partial blocks).
  RequestOptions twice = greedy(8);
  twice.n = 2;
  Engine forked(ckpt, bf16_cache);
  const auto samples = run_all(forked, prompts, twice);
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int k = 0; k < 2; ++k) {
      expect_same(samples[i][k], together[i][0], "prompt " + std::to_string(i) + " sample " + std::to_string(k));
    }
  }
  EXPECT_EQ(forked.blocks().used_blocks(), 0);
}

// `loom generate --dtype` (Transformer::decode) under a recipe: the last prompt row's logits equal
// those of one paged step over the prompt under the same recipe (the engine's path), not the fp32
// model's.
TEST_P(EngineDtypeTest, GenerationDecodesUnderTheEnginesRecipe) {
  const std::string ckpt = checkpoint_of(GetParam());
  const std::vector<int32_t> prompt = prompts_of({13})[0];
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto logits_of = [&](model::Transformer& m, bool paged) {
    const int64_t V = m.config().vocab_size;
    if (!paged) {
      model::DecodeState state;
      const float* l = m.decode(state, prompt.data(), n);
      return std::vector<float>(l, l + V);
    }
    model::PagedKVCache cache = m.make_paged_cache(4, 4, 1);
    model::PagedBatch batch;
    batch.tokens = prompt;
    for (int32_t p = 0; p < n; ++p) batch.positions.push_back(p);
    batch.sequences.assign(prompt.size(), 0);
    batch.block_tables = {0, 1, 2, 3};
    batch.table_width = 4;
    if (cache.state_slots > 0) batch.state_slots = {0};
    batch.logit_rows = {n - 1};
    model::PagedScratch scratch;
    const float* l = m.forward_paged(batch, cache, scratch);
    return std::vector<float>(l, l + V);
  };
  auto bf16 = load_model(ckpt, inference_policy(config::PrecisionRecipe::Bf16));
  auto fp32 = load_model(ckpt);
  const std::vector<float> decoded = logits_of(*bf16, false), paged = logits_of(*bf16, true);
  const std::vector<float> decoded_fp32 = logits_of(*fp32, false);
  float to_paged = 0.0f, to_fp32 = 0.0f;
  for (size_t i = 0; i < decoded.size(); ++i) {
    to_paged = std::max(to_paged, std::fabs(decoded[i] - paged[i]));
    to_fp32 = std::max(to_fp32, std::fabs(decoded[i] - decoded_fp32[i]));
  }
  std::printf("%s: bf16 decode's logits against a bf16 paged step %.3g, against fp32 decode %.3g\n",
              GetParam().c_str(), to_paged, to_fp32);
  EXPECT_LT(to_paged, 1e-5f) << GetParam();
  EXPECT_GT(to_fp32, 100.0f * std::max(to_paged, 1e-6f)) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Families, EngineDtypeTest, ::testing::Values("llama", "gpt2", "moe", "hybrid"));

TEST(EngineDtype, TheKvCacheFollowsTheGemmsUnlessNamed) {
  using config::PrecisionRecipe;
  EXPECT_EQ(kv_cache_dtype(KvCacheSetting::Auto, PrecisionRecipe::Fp32), kernels::KvCacheDtype::Fp32);
  EXPECT_EQ(kv_cache_dtype(KvCacheSetting::Auto, PrecisionRecipe::Bf16), kernels::KvCacheDtype::Bf16);
  EXPECT_EQ(kv_cache_dtype(KvCacheSetting::Auto, PrecisionRecipe::Fp16), kernels::KvCacheDtype::Bf16);
  EXPECT_EQ(kv_cache_dtype(KvCacheSetting::Fp32, PrecisionRecipe::Bf16), kernels::KvCacheDtype::Fp32);
  EXPECT_EQ(kv_cache_dtype(KvCacheSetting::Bf16, PrecisionRecipe::Fp32), kernels::KvCacheDtype::Bf16);
  EngineOptions bf16;
  bf16.dtype = InferenceDtype::Bf16;
  EXPECT_EQ(Engine(checkpoint_of("gpt2"), bf16).kv_cache_dtype(), kernels::KvCacheDtype::Bf16);
  EXPECT_EQ(Engine(checkpoint_of("gpt2"), {}).kv_cache_dtype(), kernels::KvCacheDtype::Fp32);
  for (KvCacheSetting k : {KvCacheSetting::Auto, KvCacheSetting::Fp32, KvCacheSetting::Bf16}) {
    EXPECT_EQ(parse_kv_cache_setting(config::to_string(k)), k);
  }
  EXPECT_THROW(parse_kv_cache_setting("fp8"), Error);
}

TEST(EngineDtype, AutoIsFp32OnTheCpu) {
  EXPECT_EQ(inference_recipe(InferenceDtype::Auto, config::RuntimeDevice::Cpu), config::PrecisionRecipe::Fp32);
  EXPECT_EQ(inference_recipe(InferenceDtype::Auto, config::RuntimeDevice::Cuda), config::PrecisionRecipe::Bf16);
  EXPECT_EQ(inference_recipe(InferenceDtype::Fp16, config::RuntimeDevice::Cuda), config::PrecisionRecipe::Fp16);
  EXPECT_EQ(inference_recipe(InferenceDtype::Fp32, config::RuntimeDevice::Cuda), config::PrecisionRecipe::Fp32);
  Engine engine(checkpoint_of("llama"), {});
  EXPECT_EQ(engine.recipe(), config::PrecisionRecipe::Fp32);
}

TEST(EngineDtype, NamesRoundTripAndAnUnknownOneIsRefusedNamingTheValidOnes) {
  for (InferenceDtype d : {InferenceDtype::Auto, InferenceDtype::Fp32, InferenceDtype::Bf16, InferenceDtype::Fp16}) {
    EXPECT_EQ(parse_inference_dtype(config::to_string(d)), d);
  }
  try {
    parse_inference_dtype("fp8");
    FAIL() << "fp8 accepted";
  } catch (const Error& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("dtype = 'fp8' is invalid"), std::string::npos) << text;
    EXPECT_NE(text.find("auto, fp32, bf16, fp16"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace loom::infer::testing
