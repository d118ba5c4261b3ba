// Module-level finite-difference checks: one block (norms, attention, MLP, residuals) with
// respect to its input and every parameter, for the GPT-2 and Llama block variants.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "../gradient_check.h"
#include "loom/kernels/cpu/rope.h"
#include "loom/model/block.h"

namespace loom::model {
namespace {

// Every gradient scratch buffer filled with NaN, as another block's backward could leave it
// (stale values): a gradient written whole never reads it, one that is added into is zeroed first.
void poison(Workspace& work, int64_t n) {
  for (Buffer* b : {&work.d_normed, &work.d_att, &work.d_qkv, &work.d_hidden, &work.d_act, &work.d_mixer_proj,
                    &work.d_mixer_conv, &work.d_mixer_scan, &work.d_mixer_gated}) {
    float* p = sized(*b, n);
    std::fill(p, p + n, std::numeric_limits<float>::quiet_NaN());
  }
}

void check_block(config::ModelConfig config, const LayerSpec& spec, bool use_rope) {
  ParameterStore store;
  std::unique_ptr<kernels::cpu::RopeTable> rope;
  if (use_rope) rope = std::make_unique<kernels::cpu::RopeTable>(config.max_seq_len, config.d_model / config.heads, 10000.0);
  TensorParallel tp;  // one rank
  Block block(store, tp, 0, config, spec, rope.get());
  store.allocate();
  store.initialize(3);
  // Non-trivial norm weights and biases so their gradients are exercised too.
  for (int64_t i = 0; i < store.total(); ++i) store.values()[i] += 0.1f * static_cast<float>((i * 7919) % 13) / 13.0f;
  const int64_t batch = 2, seq = 5, n = batch * seq * config.d_model;
  auto x = loom::testing::random_vector(n, 11), dy = loom::testing::random_vector(n, 12);
  std::vector<float> y(n);
  Block::Saved saved;
  Workspace work;
  poison(work, 4096);  // more than any of these blocks uses
  ParallelScratch scratch;
  auto loss = [&] {
    block.forward(saved, x.data(), y.data(), batch, seq, {}, scratch);
    return loom::testing::weighted_sum(y.data(), dy.data(), n);
  };
  loss();
  store.zero_grads();
  std::vector<float> dx = dy;  // d(x_out) in, d(x_in) out
  ResidualGradForReader d_x16;  // none on the CPU
  block.backward(dx.data(), d_x16, x.data(), saved, work, batch, seq, {}, scratch);
  std::vector<float> analytic(store.grads(), store.grads() + store.total());
  loom::testing::FdTolerance tol{.eps = 1e-2, .atol = 1e-3, .rtol = 1e-2, .max_checks = 24};
  loom::testing::expect_gradient_matches("d_input", x.data(), n, dx.data(), loss, tol);
  for (const Parameter& p : store.list()) {
    loom::testing::expect_gradient_matches(p.name, store.values() + p.offset, p.numel, analytic.data() + p.offset,
                                           loss, tol);
  }
}

TEST(BlockGradients, Gpt2Block) {
  config::ModelConfig c;
  c.d_model = 12;
  c.heads = 3;
  c.ffn_size = 20;
  c.norm = config::Norm::Layer;
  c.activation = config::Activation::Gelu;
  c.positions = config::Positions::Learned;
  c.bias = true;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  check_block(c, {true, 3, 20}, false);
}

TEST(BlockGradients, LlamaGqaBlock) {
  config::ModelConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 24;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  check_block(c, {true, 2, 24}, true);
}

TEST(BlockGradients, AttentionOnlyAndMlpOnlyBlocks) {
  config::ModelConfig c;
  c.d_model = 16;
  c.heads = 4;
  c.ffn_size = 24;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  check_block(c, {true, 1, 0}, true);   // no MLP
  check_block(c, {false, 4, 24}, true);  // no attention
}

// A hybrid (Nemotron-H) layer: pre-norm + Mamba-2 mixer, two groups of heads, a block size
// that does not divide the sequence; and a squared-ReLU MLP layer.
TEST(BlockGradients, MambaMixerBlockAndRelu2MlpBlock) {
  config::ModelConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.ffn_size = 12;
  c.max_seq_len = 8;
  c.init_std = 0.3;
  c.layers = 1;
  c.mamba = {.state_size = 3, .heads = 4, .head_dim = 2, .groups = 2, .conv_kernel = 3, .chunk_size = 2, .expand = 2};
  check_block(c, {.has_attention = false, .kv_heads = 2, .ffn_size = 0, .has_mamba = true}, false);
  c.activation = config::Activation::Relu2;
  check_block(c, {false, 2, 12}, false);
}

}  // namespace
}  // namespace loom::model
