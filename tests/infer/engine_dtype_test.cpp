// The engine's GEMM dtype (EngineOptions::dtype, `loom serve --dtype`): bf16 and fp16 engines
// compute what the training path's forward does under that precision recipe, not the fp32 model;
// auto is fp32 on the cpu. (On a device: device_engine_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine_support.h"
#include "loom/core/error.h"

namespace loom::infer::testing {
namespace {

model::PrecisionPolicy policy_of(config::PrecisionRecipe recipe) {
  model::PrecisionPolicy policy;
  policy.recipe = recipe;
  policy.attention = config::AttentionPrecision::Fp32;  // the paged attention reads the fp32 KV cache
  return policy;
}

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
    options.block_size = 4;
    options.max_batch_tokens = 9;  // prompts in chunks beside decoding samples
    Engine engine(ckpt, options);
    EXPECT_EQ(engine.recipe(), recipe);
    const auto got = run_all(engine, prompts, greedy(8));
    Agreement own, fp32;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Completion& c = got[i][0];
      own.add(c.logprobs, full_forward_logprobs(ckpt, prompts[i], c.tokens, policy_of(recipe)));
      fp32.add(c.logprobs, full_forward_logprobs(ckpt, prompts[i], c.tokens));
    }
    const std::string what = GetParam() + " " + inference_dtype_name(dtype);
    std::printf("%s: to its recipe's forward %d of %d equal, largest difference %.3g; to fp32's %d equal, %.3g\n",
                what.c_str(), own.equal, own.total, own.largest, fp32.equal, fp32.largest);
    EXPECT_GE(own.equal, own.total * 9 / 10) << what;
    EXPECT_LT(own.largest, 1e-3f) << what;
    EXPECT_LE(fp32.equal, fp32.total / 4) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineDtypeTest, ::testing::Values("llama", "gpt2", "moe", "hybrid"));

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
    EXPECT_EQ(parse_inference_dtype(inference_dtype_name(d)), d);
  }
  try {
    parse_inference_dtype("fp8");
    FAIL() << "fp8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fp8' is not one of auto, fp32, bf16, fp16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::infer::testing
