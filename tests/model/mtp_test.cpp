// Multi-token prediction (model.mtp_depths): finite-difference gradients of the whole objective
// (main loss + mtp_loss_weight / depths x the depths' losses), the tokens and targets each depth
// sees (rows and documents), each depth's own final norm, recompute, and a zero weight leaving the
// main model untouched.
#include <gtest/gtest.h>

#include "../gradient_check.h"
#include "loom/core/philox.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/model/flops.h"
#include "loom/model/transformer.h"

namespace loom::model {
namespace {

config::ModelConfig llama_with_mtp() {
  config::ModelConfig c;
  c.vocab_size = 17;
  c.d_model = 12;
  c.layers = 2;
  c.heads = 3;
  c.kv_heads = 1;
  c.ffn_size = 16;
  c.tied_embeddings = false;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  c.mtp_depths = 2;
  c.mtp_loss_weight = 0.7;
  return c;
}

// GPT-2 style: tied head, learned positions, LayerNorm, GELU, biases.
config::ModelConfig gpt2_with_mtp() {
  config::ModelConfig c = llama_with_mtp();
  c.norm = config::Norm::Layer;
  c.activation = config::Activation::Gelu;
  c.positions = config::Positions::Learned;
  c.tied_embeddings = true;
  c.bias = true;
  c.mtp_depths = 1;
  return c;
}

// Nemotron-H style: Mamba-2 and attention layers, squared-ReLU MLPs.
config::ModelConfig hybrid_with_mtp() {
  config::ModelConfig c = llama_with_mtp();
  c.layers = 3;
  c.layer_pattern = "M*-";
  c.activation = config::Activation::Relu2;
  c.mamba.state_size = 4;
  c.mamba.heads = 2;
  c.mamba.head_dim = 6;
  c.mamba.chunk_size = 4;
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

Batch make_batch(int vocab, int64_t rows, uint64_t seed) {
  Batch b;
  const uint64_t key = philox_key(seed, "mtp-batch");
  for (int64_t i = 0; i < rows; ++i) {
    b.inputs.push_back(static_cast<int32_t>(philox4x32(key, i)[0] % vocab));
    b.targets.push_back(static_cast<int32_t>(philox4x32(key, i)[1] % vocab));
  }
  b.targets[3] = kernels::cpu::kIgnoreIndex;
  return b;
}

double objective(Transformer& model, const Batch& data, int64_t batch, int64_t seq) {
  double total = model.forward_loss(data.inputs.data(), data.targets.data(), batch, seq);
  const config::ModelConfig& c = model.config();
  for (double sum : model.last_mtp_loss_sums()) total += c.mtp_loss_weight / c.mtp_depths * sum;
  return total;
}

void check_gradients(const config::ModelConfig& config, double eps = 1e-2) {
  Transformer model(config);
  model.initialize(11);
  const int64_t batch = 2, seq = 6;
  const Batch data = make_batch(config.vocab_size, batch * seq, 5);
  model.params().zero_grads();
  model.forward_backward(data.inputs.data(), data.targets.data(), batch, seq, 1.0f);
  const std::vector<float> analytic(model.params().grads(), model.params().grads() + model.params().total());
  ASSERT_GE(model.params().find("mtp.layers.0.eh_proj.weight"), 0);
  auto loss = [&] { return objective(model, data, batch, seq); };
  for (const Parameter& p : model.params().list()) {
    loom::testing::expect_gradient_matches(p.name, model.params().values() + p.offset, p.numel,
                                           analytic.data() + p.offset, loss,
                                           {.eps = eps, .atol = 2e-3, .rtol = 2e-2, .max_checks = 10});
  }
}

TEST(MtpGradients, LlamaStyleMatchesFiniteDifferences) { check_gradients(llama_with_mtp()); }
TEST(MtpGradients, Gpt2StyleTiedHeadMatchesFiniteDifferences) { check_gradients(gpt2_with_mtp()); }
TEST(MtpGradients, HybridMatchesFiniteDifferences) { check_gradients(hybrid_with_mtp()); }

// model.mtp_use_repeated_layer: one depth's weights at both depths, their gradient both depths'.
TEST(MtpGradients, RepeatedLayerMatchesFiniteDifferences) {
  config::ModelConfig llama = llama_with_mtp(), hybrid = hybrid_with_mtp();
  llama.mtp_use_repeated_layer = hybrid.mtp_use_repeated_layer = true;
  check_gradients(llama);
  // An embedding row of the hybrid reaches the loss through both depths' norms of the same
  // weights: curved enough that eps 1e-2 is 16% off one entry (3e-3: 1%, 1e-3: 2% of fp32 noise).
  check_gradients(hybrid, 3e-3);
  Transformer model(llama);
  EXPECT_EQ(model.mtp_depths(), 2);
  for (const Parameter& p : model.params().list()) EXPECT_EQ(p.name.find("mtp.layers.1."), std::string::npos) << p.name;
}

TEST(Mtp, DepthsSeeTheTokensAheadWithinARowAndDocument) {
  const int32_t inputs[] = {1, 2, 3, 4, 5, 6, 7, 8};
  const int32_t targets[] = {2, 3, 4, 5, 6, 7, 8, 9};
  const int32_t documents[] = {0, 0, 0, 1, 1, 1, 1, 1};  // row 0: documents 0 | 1; row 1: document 1
  MtpDepth::Saved s;
  // Depth 2 at position t: the input t + 2 and the target t + 2 (the token 3 ahead).
  MtpDepth::shift(s, 2, inputs, targets, 2, 4, nullptr);
  EXPECT_EQ(s.tokens, (std::vector<int32_t>{3, 4, 0, 0, 7, 8, 0, 0}));
  const int32_t I = kernels::cpu::kIgnoreIndex;
  EXPECT_EQ(s.targets, (std::vector<int32_t>{4, 5, I, I, 8, 9, I, I}));
  MtpDepth::shift(s, 2, inputs, targets, 2, 4, documents);
  EXPECT_EQ(s.targets, (std::vector<int32_t>{4, I, I, I, 8, 9, I, I}));  // 1 -> 3 crosses a document
}

TEST(Mtp, RecomputeGivesIdenticalGradients) {
  config::ModelConfig c = hybrid_with_mtp();
  Transformer plain(c);
  c.recompute = true;
  Transformer recompute(c);
  plain.initialize(3);
  recompute.initialize(3);
  const Batch data = make_batch(c.vocab_size, 3 * 7, 9);
  plain.params().zero_grads();
  recompute.params().zero_grads();
  EXPECT_EQ(plain.forward_backward(data.inputs.data(), data.targets.data(), 3, 7, 0.1f),
            recompute.forward_backward(data.inputs.data(), data.targets.data(), 3, 7, 0.1f));
  EXPECT_EQ(plain.last_mtp_loss_sums(), recompute.last_mtp_loss_sums());
  for (int64_t i = 0; i < plain.params().total(); ++i) {
    ASSERT_EQ(plain.params().grads()[i], recompute.params().grads()[i]) << i;
  }
}

// With mtp_loss_weight 0 the depths still report their losses but the main model's gradients
// are those of the model without multi-token prediction.
TEST(Mtp, ZeroWeightLeavesTheMainModelAlone) {
  config::ModelConfig with = llama_with_mtp();
  with.mtp_loss_weight = 0.0;
  config::ModelConfig without = with;
  without.mtp_depths = 0;
  Transformer a(with), b(without);
  a.initialize(4);
  b.initialize(4);
  const Batch data = make_batch(with.vocab_size, 2 * 6, 2);
  a.params().zero_grads();
  b.params().zero_grads();
  EXPECT_EQ(a.forward_backward(data.inputs.data(), data.targets.data(), 2, 6, 1.0f),
            b.forward_backward(data.inputs.data(), data.targets.data(), 2, 6, 1.0f));
  ASSERT_EQ(a.last_mtp_loss_sums().size(), 2u);
  EXPECT_GT(a.last_mtp_loss_sums()[1], 0.0);
  const MtpTotals totals = a.take_mtp_totals();
  EXPECT_EQ(totals.loss_sums, a.last_mtp_loss_sums());
  EXPECT_EQ(totals.tokens, (std::vector<double>{2 * 5 - 1, 2 * 4 - 1}));  // one target masked in each
  EXPECT_EQ(a.take_mtp_totals().tokens, (std::vector<double>{0, 0}));
  for (const Parameter& p : b.params().list()) {
    const Parameter& q = a.params().list()[a.params().find(p.name)];
    for (int64_t i = 0; i < p.numel; ++i) ASSERT_EQ(b.params().grads()[p.offset + i], a.params().grads()[q.offset + i]) << p.name;
  }
}

// Each depth ends in its own final norm (Megatron-Core's final_layernorm), whose output is both
// that depth's head input and the next depth's h: depth 2's norm changes depth 2's loss alone,
// depth 1's changes both depths' and never the main loss.
TEST(Mtp, EachDepthEndsInItsOwnFinalNorm) {
  Transformer model(llama_with_mtp());
  model.initialize(6);
  const Batch data = make_batch(model.config().vocab_size, 2 * 6, 3);
  auto losses = [&] {
    const double main = model.forward_loss(data.inputs.data(), data.targets.data(), 2, 6);
    return std::vector<double>{main, model.last_mtp_loss_sums()[0], model.last_mtp_loss_sums()[1]};
  };
  const std::vector<double> before = losses();
  auto scale = [&](const std::string& name) {
    const Parameter& p = model.params().list()[model.params().find(name)];
    ASSERT_EQ(p.numel, model.config().d_model) << name;
    for (int64_t i = 0; i < p.numel; ++i) model.params().values()[p.offset + i] *= 1.0f + 0.1f * static_cast<float>(i);
  };
  scale("mtp.layers.1.final_layernorm.weight");
  const std::vector<double> second = losses();
  EXPECT_EQ(second[0], before[0]);
  EXPECT_EQ(second[1], before[1]);
  EXPECT_GT(std::abs(second[2] - before[2]), 1e-4 * before[2]);
  scale("mtp.layers.0.final_layernorm.weight");
  const std::vector<double> first = losses();
  EXPECT_EQ(first[0], before[0]);
  EXPECT_GT(std::abs(first[1] - second[1]), 1e-4 * second[1]);
  EXPECT_GT(std::abs(first[2] - second[2]), 1e-4 * second[2]);
}

// FLOPs (MFU, the pipeline's head cost) count each depth: eh_proj, its block and the head again.
TEST(Mtp, FlopsCountEveryDepth) {
  config::ModelConfig with = llama_with_mtp(), without = with;
  without.mtp_depths = 0;
  const int64_t seq = 8;
  const double C = with.d_model, head = 3.0 * 2.0 * C * with.vocab_size;
  const double depth = head + 3.0 * 2.0 * 2.0 * C * C + layer_training_flops_per_token(with, mtp_block_spec(with), seq);
  EXPECT_DOUBLE_EQ(head_training_flops_per_token(without, seq), head);
  EXPECT_DOUBLE_EQ(head_training_flops_per_token(with, seq), head + 2.0 * depth);
  const double total = Transformer(with).training_flops_per_token(seq);
  EXPECT_NEAR(total - Transformer(without).training_flops_per_token(seq), 2.0 * depth, 1e-12 * total);
}

}  // namespace
}  // namespace loom::model
