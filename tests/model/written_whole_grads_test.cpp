// Gradients written whole (model/parameters.h): zero_grads() leaves the linear layers' weight
// gradients stale, and their first backward writes them instead of adding. The store's
// bookkeeping, then whole models whose gradient buffer holds NaN before zero_grads(): any
// gradient added into while stale would carry the NaN, so every gradient must equal a model's
// whose buffer was zero all along, micro-batches accumulating as before.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/core/philox.h"
#include "loom/kernels/ops.h"
#include "loom/model/transformer.h"
#include "small_configs.h"

namespace loom::model {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Four parameters of 3, 5, 2 and 4 elements: offsets 0, 3, 8, 10.
struct FourParameters {
  ParameterStore store;
  int a, b, c, d;
  FourParameters() {
    a = store.add("a", {3}, Init::Zeros);
    b = store.add("b.weight", {5}, Init::Zeros);
    c = store.add("c.weight", {2}, Init::Zeros);
    d = store.add("d", {4}, Init::Zeros);
    store.allocate();
  }
  void fill(float v) { std::fill_n(store.grads(), store.total(), v); }
  std::vector<float> grads() { return {store.grads(), store.grads() + store.total()}; }
};

TEST(WrittenWholeGrads, ZeroGradsZeroesAroundTheRangesAndLeavesThemStale) {
  FourParameters p;
  p.store.mark_written_whole(3, 7);  // b and c
  p.fill(7.0f);
  p.store.zero_grads();
  EXPECT_EQ(p.grads(), (std::vector<float>{0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 0, 0, 0, 0}));
  EXPECT_FALSE(p.store.stale(p.a));
  EXPECT_TRUE(p.store.stale(p.b));
  EXPECT_TRUE(p.store.stale(p.c));
  EXPECT_FALSE(p.store.stale(p.d));
  // Taken whole: the caller writes it; nothing is zeroed and it is stale no longer.
  EXPECT_TRUE(p.store.take_written_whole(3, 7));
  EXPECT_FALSE(p.store.stale(p.b));
  EXPECT_FALSE(p.store.stale(p.c));
  EXPECT_EQ(p.grads()[3], 7.0f);
  // Taken again before the next zero_grads(): the caller adds.
  EXPECT_FALSE(p.store.take_written_whole(3, 7));
}

TEST(WrittenWholeGrads, WithoutRangesZeroGradsZeroesEverything) {
  FourParameters p;
  p.fill(7.0f);
  p.store.zero_grads();
  EXPECT_EQ(p.grads(), std::vector<float>(14, 0.0f));
  EXPECT_FALSE(p.store.take_written_whole(3, 5));
}

TEST(WrittenWholeGrads, ARangeOnlyPartlyStaleIsZeroedThereAndAddedInto) {
  FourParameters p;
  p.store.mark_written_whole(3, 5);  // b
  p.store.mark_written_whole(8, 2);  // c
  p.fill(7.0f);
  p.store.zero_grads();
  ASSERT_TRUE(p.store.take_written_whole(3, 5));
  std::fill_n(p.store.grad(p.b), 5, 1.0f);  // b written
  // b and c together (a fused projection): c is zeroed, b kept, and the caller adds into both.
  EXPECT_FALSE(p.store.take_written_whole(3, 7));
  EXPECT_EQ(p.grads(), (std::vector<float>{0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_FALSE(p.store.stale(p.c));
}

TEST(WrittenWholeGrads, SettlingZeroesWhatIsStillStale) {
  FourParameters p;
  p.store.mark_written_whole(3, 7);
  p.fill(7.0f);
  p.store.zero_grads();
  const std::vector<int> only_c = {p.c};
  p.store.settle_grads(only_c);
  EXPECT_FALSE(p.store.stale(p.c));
  EXPECT_TRUE(p.store.stale(p.b));
  EXPECT_EQ(p.grads()[8], 0.0f);
  EXPECT_EQ(p.grads()[3], 7.0f);
  const std::vector<int> all = {p.a, p.b, p.c, p.d};
  p.store.settle_grads(all);
  EXPECT_EQ(p.grads(), std::vector<float>(14, 0.0f));
  EXPECT_FALSE(p.store.stale(p.b));
}

TEST(WrittenWholeGrads, ARangeOffTheParametersIsAnErrorNamingIt) {
  FourParameters p;
  try {
    p.store.mark_written_whole(4, 4);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4, 8)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(p.store.mark_written_whole(3, 20), Error);
}

TEST(ZeroRuns, ZeroesEachRunAndNothingElse) {
  std::vector<float> x(40, 5.0f);
  const std::vector<kernels::FloatRun> runs = {{1, 3}, {7, 0}, {10, 17}, {39, 1}};
  kernels::zero_runs(Device::cpu(), x.data(), runs);
  for (int i = 0; i < 40; ++i) {
    const bool zeroed = (i >= 1 && i < 4) || (i >= 10 && i < 27) || i == 39;
    EXPECT_EQ(x[i], zeroed ? 0.0f : 5.0f) << i;
  }
  const std::vector<kernels::FloatRun> bad = {{-1, 2}};
  EXPECT_THROW(kernels::zero_runs(Device::cpu(), x.data(), bad), Error);
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch make_batch(int vocab, int64_t rows, uint64_t seed) {
  Batch b;
  const uint64_t key = philox_key(seed, "written-whole-batch");
  for (int64_t i = 0; i < rows; ++i) {
    b.inputs.push_back(static_cast<int32_t>(philox4x32(key, i)[0] % vocab));
    b.targets.push_back(static_cast<int32_t>(philox4x32(key, i)[1] % vocab));
  }
  return b;
}

// Two micro-batches into gradients zeroed from NaN, against the same into a buffer never stale.
void expect_same_gradients_from_nan(const config::ModelConfig& config, TensorParallel tp = {}) {
  const int64_t batch = 2, seq = 6;
  const Batch first = make_batch(config.vocab_size, batch * seq, 3);
  const Batch second = make_batch(config.vocab_size, batch * seq, 4);
  auto run = [&](Transformer& model) {
    model.forward_backward(first.inputs.data(), first.targets.data(), batch, seq, 0.5f);
    model.forward_backward(second.inputs.data(), second.targets.data(), batch, seq, 0.5f);
  };
  Transformer fresh(config, tp), poisoned(config, tp);
  fresh.initialize(9);
  poisoned.initialize(9);
  int stale = 0;
  ParameterStore& p = poisoned.params();
  std::fill_n(p.grads(), p.total(), kNaN);
  p.zero_grads();
  for (size_t id = 0; id < p.list().size(); ++id) stale += p.stale(static_cast<int>(id)) ? 1 : 0;
  EXPECT_GT(stale, 0) << "no gradient was left stale: nothing here tests writing whole";
  run(fresh);
  run(poisoned);
  for (const Parameter& param : p.list()) {
    const float* want = fresh.params().grad(fresh.params().find(param.name));
    const float* got = p.grad(p.find(param.name));
    for (int64_t i = 0; i < param.numel; ++i) {
      ASSERT_EQ(got[i], want[i]) << param.name << "[" << i << "]";
    }
  }
}

config::ModelConfig gpt2_style() { return testing::small_gpt2(); }

config::ModelConfig llama_style() {
  config::ModelConfig c;
  c.vocab_size = 19;
  c.d_model = 16;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.tied_embeddings = false;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  return c;
}

// Mamba-2, latent MoE with a shared expert, attention and an MLP, and a multi-token depth.
config::ModelConfig hybrid_style() {
  config::ModelConfig c = llama_style();
  c.layers = 4;
  c.layer_pattern = "ME*-";
  c.activation = config::Activation::Relu2;
  c.mamba.state_size = 4;
  c.mamba.heads = 2;
  c.mamba.head_dim = 8;
  c.mamba.chunk_size = 4;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.ffn_size = 8;
  c.moe.shared_ffn_size = 8;
  c.moe.latent_size = 8;
  c.mtp_depths = 1;
  c.mtp_loss_weight = 0.5;
  return c;
}

TEST(WrittenWholeGrads, Gpt2StyleModel) { expect_same_gradients_from_nan(gpt2_style()); }

TEST(WrittenWholeGrads, LlamaStyleModelWithRecompute) {
  config::ModelConfig c = llama_style();
  c.recompute = true;
  expect_same_gradients_from_nan(c);
}

TEST(WrittenWholeGrads, HybridModelWithMoeAndMtp) { expect_same_gradients_from_nan(hybrid_style()); }

// Tensor parallel with sequence parallelism, a kv head per two ranks: the fused q/k/v gradient's
// k and v parts are summed over their holders, set aside as they read at the unit's start.
TEST(WrittenWholeGrads, TensorParallelWithReplicatedKvHeads) {
  config::ModelConfig c = llama_style();
  c.heads = 4;
  c.kv_heads = 1;
  c.vocab_size = 20;
  comm::LaunchOptions options;
  options.ranks = 2;
  options.comm.timeout = std::chrono::seconds(30);
  comm::launch(options, [&](comm::Communicator& world) {
    expect_same_gradients_from_nan(c, TensorParallel(&world, true));
  });
}

}  // namespace
}  // namespace loom::model
