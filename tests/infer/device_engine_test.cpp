// The engine on the emulated CUDA device (tests/support/emulated_cuda.h): weights, KV blocks and
// every step's forward on the device (any host access of its memory crashes), sampling on the
// host. Its tokens and log-probabilities equal the cpu engine's bit for bit: batching with
// chunked prefill, prefix sharing, the n samples of a prompt (forked blocks), seeded sampling,
// tensor parallelism, and the weights' digest before and after new weights are loaded; a hybrid
// Mamba-2 model's states in the device's state pool.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "engine_support.h"
#include "loom/ckpt/digest.h"
#include "loom/core/error.h"
#include "support/emulated_cuda.h"

namespace loom::infer::testing {
namespace {

// On the device with the GEMMs' dtype the cpu engine resolves `auto` to (fp32), unless one is named.
EngineOptions on_device(EngineOptions options) {
  options.device = config::RuntimeDevice::Cuda;
  if (options.dtype == InferenceDtype::Auto) options.dtype = InferenceDtype::Fp32;
  return options;
}

// Bit for bit: the device's kernels are the cpu's on the same inputs.
void expect_identical(const std::vector<std::vector<Completion>>& got,
                      const std::vector<std::vector<Completion>>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), expected[r].size());
    for (size_t k = 0; k < got[r].size(); ++k) {
      EXPECT_EQ(got[r][k].tokens, expected[r][k].tokens) << "request " << r << " sample " << k;
      EXPECT_EQ(got[r][k].logprobs, expected[r][k].logprobs) << "request " << r << " sample " << k;
      EXPECT_EQ(got[r][k].finish_reason, expected[r][k].finish_reason) << "request " << r << " sample " << k;
      EXPECT_FALSE(got[r][k].tokens.empty());
    }
  }
}

std::vector<std::vector<Completion>> run_on(const std::string& ckpt, const EngineOptions& options,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            const RequestOptions& request) {
  Engine engine(ckpt, options);
  auto out = run_all(engine, prompts, request);
  EXPECT_EQ(engine.blocks().used_blocks(), 0);
  return out;
}

// The model of checkpoint_of(name) trained from another seed: other weights of the same shapes.
std::string reseeded_checkpoint(const std::string& name) {
  static std::map<std::string, std::string> made;
  if (made.count(name) != 0) return made[name];
  static const std::string root = loom::train::testing::make_training_root("infer-reseeded");
  std::string yaml = name == "llama" ? llama_yaml() : name == "moe" ? moe_yaml() : gpt2_yaml();
  yaml.replace(yaml.find("seed: "), 6, "seed: 1");
  loom::train::testing::train_run(root, name, yaml + loom::train::testing::data_section(root), {});
  return made[name] = root + "/" + name + "/checkpoints";
}

class DeviceEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ::loom::testing::install_emulated_cuda(); }
};

TEST_P(DeviceEngineTest, BatchedRequestsOfDifferentLengthsEqualTheCpu) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({3, 9, 17, 30});
  EngineOptions options;
  options.block_size = 5;        // sequences end inside blocks
  options.max_batch_tokens = 7;  // prompts arrive in chunks next to decoding samples
  RequestOptions request = greedy(10);
  request.max_tokens = 9;
  expect_identical(run_on(ckpt, on_device(options), prompts, request), run_on(ckpt, options, prompts, request));
}

TEST_P(DeviceEngineTest, SharedPrefixesForksAndSeededSamplingEqualTheCpu) {
  const std::string ckpt = checkpoint_of(GetParam());
  auto prompts = prompts_of({21, 21, 13});
  prompts[1] = prompts[0];
  prompts[1].back() = 'x';  // the first 20 tokens cached from the first prompt
  EngineOptions options;
  options.block_size = 4;
  options.max_batch_tokens = 5;  // the second prompt starts after the first one's blocks are cached
  RequestOptions sampled;
  sampled.sampling = {.temperature = 1.0, .top_k = 50, .top_p = 0.95, .min_p = 0.01};
  sampled.seed = 42;
  sampled.max_tokens = 12;
  sampled.n = 3;  // the samples fork the prompt's partial last block
  sampled.ignore_eos = true;
  Engine device(ckpt, on_device(options));
  const auto got = run_all(device, prompts, sampled);
  expect_identical(got, run_on(ckpt, options, prompts, sampled));
  EXPECT_GT(device.metrics().cached_prompt_tokens.load(), 0);
  EXPECT_FALSE(got[2][0].tokens == got[2][1].tokens && got[2][1].tokens == got[2][2].tokens);
  EXPECT_EQ(device.blocks().used_blocks(), 0);
}

TEST_P(DeviceEngineTest, TensorParallelOnTheDeviceEqualsTheCpu) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({5, 18, 11});
  EngineOptions tp2;
  tp2.tp = 2;  // ranks on cuda:0 and cuda:1, their collectives staged through the host
  tp2.max_batch_tokens = 8;
  RequestOptions request = greedy(8);
  request.n = 2;
  expect_identical(run_on(ckpt, on_device(tp2), prompts, request), run_on(ckpt, tp2, prompts, request));
}

// New weights (a refit) are uploaded into the device's parameters: the digest is the checkpoint's.
TEST_P(DeviceEngineTest, WeightsDigestOnTheDeviceIsTheCheckpointsBeforeAndAfterALoad) {
  const std::string ckpt = checkpoint_of(GetParam()), other = reseeded_checkpoint(GetParam());
  const std::string expected = ckpt::parameter_digest(ckpt), loaded = ckpt::parameter_digest(other);
  ASSERT_NE(expected, loaded);
  for (int tp : {1, 2}) {
    EngineOptions options;
    options.tp = tp;
    Engine engine(ckpt, on_device(options));
    std::thread loop([&] { engine.run(); });
    const auto before = engine.weights_digest().first;
    EXPECT_EQ(engine.load_weights(other, "v2"), "v2");
    const auto [after, version] = engine.weights_digest();
    engine.stop(true);
    loop.join();
    EXPECT_EQ(before, expected) << "tp " << tp;
    EXPECT_EQ(after, loaded) << "tp " << tp;
    EXPECT_EQ(version, "v2");
  }
}

// bf16 GEMMs (`--dtype bf16`, what auto is on a GPU) on the device: the cpu engine's bf16 tokens
// and log-probabilities, bit for bit, with the weights' casts kept from step to step (tp 1 and 2).
TEST_P(DeviceEngineTest, Bf16OnTheDeviceEqualsTheCpusBf16) {
  const std::string ckpt = checkpoint_of(GetParam());
  const auto prompts = prompts_of({5, 18, 11});
  EngineOptions options;
  options.dtype = InferenceDtype::Bf16;
  options.block_size = 5;
  options.max_batch_tokens = 7;
  RequestOptions request = greedy(8);
  request.n = 2;
  for (int tp : {1, 2}) {
    options.tp = tp;
    expect_identical(run_on(ckpt, on_device(options), prompts, request), run_on(ckpt, options, prompts, request));
  }
  EngineOptions automatic;
  automatic.device = config::RuntimeDevice::Cuda;
  EXPECT_EQ(Engine(ckpt, automatic).recipe(), config::PrecisionRecipe::Bf16);
}

// Requests served by an engine already running (engine.run() on another thread).
std::vector<std::vector<Completion>> served(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                            const RequestOptions& request) {
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) streams.push_back(engine.submit(p, request));
  std::vector<std::vector<Completion>> out(prompts.size(), std::vector<Completion>(request.n));
  for (size_t r = 0; r < streams.size(); ++r) {
    while (!streams[r]->done()) drain_stream(*streams[r], out[r], std::chrono::milliseconds(20));
    EXPECT_EQ(streams[r]->error(), "") << "request " << r;
  }
  return out;
}

// The bf16 casts a GPU keeps are of the weights loaded last: after a load (a refit) the engine
// answers as a fresh one on the new weights, not with the casts of the old.
TEST_P(DeviceEngineTest, KeptBf16CastsAreOfTheWeightsLoadedLast) {
  const std::string ckpt = checkpoint_of(GetParam()), other = reseeded_checkpoint(GetParam());
  const auto prompts = prompts_of({5, 18, 11});
  const RequestOptions request = greedy(8);
  EngineOptions options;
  options.dtype = InferenceDtype::Bf16;
  const auto fresh_on_other = run_on(other, on_device(options), prompts, request);
  Engine engine(ckpt, on_device(options));
  std::thread loop([&] { engine.run(); });
  const auto before = served(engine, prompts, request);
  engine.load_weights(other, "v2");
  const auto after = served(engine, prompts, request);
  engine.stop(true);
  loop.join();
  expect_identical(before, run_on(ckpt, on_device(options), prompts, request));
  expect_identical(after, fresh_on_other);
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceEngineTest, ::testing::Values("llama", "gpt2", "moe"));

// Prompt rows in tiles (kernels::paged_prompt_attention, which a GPU runs on tensor cores for a bf16
// cache and heads of 64): the emulated device runs that entry as the exact kernel tile by tile, so
// its engine still equals the cpu's bit for bit only if the tiles cover every prompt row once,
// each of one sequence, and the decoding rows go to paged_attention. Prompts of 70, 130 and 64
// positions come in chunks of up to 100 rows beside decoding samples (tp 1 and 2).
TEST(DeviceEngine, PromptRowsInTilesEqualTheCpu) {
  ::loom::testing::install_emulated_cuda();
  const std::string ckpt = checkpoint_of("llama64");
  const auto prompts = prompts_of({70, 9, 130, 64});
  EngineOptions options;
  options.dtype = InferenceDtype::Bf16;  // and so a bf16 cache
  options.block_size = 16;
  options.max_batch_tokens = 100;
  RequestOptions request = greedy(6);
  request.n = 2;
  for (int tp : {1, 2}) {
    options.tp = tp;
    ::loom::testing::reset_emulated_census();
    const auto on_the_device = run_on(ckpt, on_device(options), prompts, request);
    const ::loom::testing::EmulatedCensus census = ::loom::testing::emulated_census();
    EXPECT_GT(census.entries.count("paged_prompt_attention") ? census.entries.at("paged_prompt_attention") : 0, 0);
    EXPECT_GT(census.entries.count("paged_attention") ? census.entries.at("paged_attention") : 0, 0);
    expect_identical(on_the_device, run_on(ckpt, options, prompts, request));
  }
}

// A hybrid (Mamba-2 / attention) model: its per-sequence Mamba states live in the device's state
// pool, stepped by the causal_conv_silu_step / ssd_scan_step kernels, and forked samples copy their
// slots on the device. Chunked prefill, the n samples of a prompt and tp 2 equal the cpu engine.
TEST(DeviceEngine, HybridModelOnTheDeviceEqualsTheCpu) {
  ::loom::testing::install_emulated_cuda();
  const std::string ckpt = checkpoint_of("hybrid");
  const auto prompts = prompts_of({3, 9, 17});
  EngineOptions options;
  options.block_size = 5;
  options.max_batch_tokens = 7;
  RequestOptions request = greedy(8);
  request.n = 2;
  expect_identical(run_on(ckpt, on_device(options), prompts, request), run_on(ckpt, options, prompts, request));
  RequestOptions sampled;
  sampled.sampling = {.temperature = 1.0, .top_k = 50, .top_p = 0.95, .min_p = 0.01};
  sampled.seed = 7;
  sampled.max_tokens = 10;
  sampled.n = 3;
  sampled.ignore_eos = true;
  expect_identical(run_on(ckpt, on_device(options), prompts, sampled), run_on(ckpt, options, prompts, sampled));
  options.tp = 2;
  expect_identical(run_on(ckpt, on_device(options), prompts, request), run_on(ckpt, options, prompts, request));
}

// Speculative decoding with multi-token prediction on the device: the drafting depths' keys and
// values, kept states and a hybrid model's Mamba snapshots in device memory, seeded sampling with
// forks and tensor parallelism as on the cpu.
TEST(DeviceEngine, SpeculativeDecodingOnTheDeviceEqualsTheCpu) {
  ::loom::testing::install_emulated_cuda();
  RequestOptions sampled;
  sampled.sampling = {.temperature = 1.5, .top_k = 40};
  sampled.seed = 3;
  sampled.max_tokens = 14;
  sampled.n = 2;
  sampled.ignore_eos = true;
  for (const std::string name : {"llama_mtp", "hybrid_mtp"}) {
    const std::string ckpt = checkpoint_of(name);
    const auto prompts = prompts_of({4, 13});
    EngineOptions options;
    options.speculative_tokens = 2;
    options.block_size = 4;
    options.max_batch_tokens = 9;
    expect_identical(run_on(ckpt, on_device(options), prompts, greedy(16)), run_on(ckpt, options, prompts, greedy(16)));
    expect_identical(run_on(ckpt, on_device(options), prompts, sampled), run_on(ckpt, options, prompts, sampled));
    options.tp = 2;
    expect_identical(run_on(ckpt, on_device(options), prompts, sampled), run_on(ckpt, options, prompts, sampled));
  }
}

}  // namespace
}  // namespace loom::infer::testing
