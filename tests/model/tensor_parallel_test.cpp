// Tensor parallelism computes the same function as one rank: each parallel layer (column- and
// row-parallel linear, vocabulary-parallel embedding and cross-entropy) and whole models
// (GPT-2-style and heterogeneous Llama-style with GQA), with and without sequence parallelism,
// forward and backward against the unsplit computation on random inputs. Ranks are threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

#include "../gradient_check.h"
#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/vocab_parallel_cross_entropy.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/transformer.h"
#include "linear_pair.h"
#include "support/thread_ranks.h"

namespace loom::model {
namespace {

using loom::testing::threads;

// max |a - b| / max |b|: normwise relative difference of a rank's result from the reference
// (infinite where an element of a is not finite).
double relative_difference(const float* a, const float* b, int64_t n) {
  double diff = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return diff / scale;
}

// Columns [start, start + count) of a row-major [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t start, int64_t count) {
  std::vector<float> out(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(m.begin() + r * cols + start, m.begin() + r * cols + start + count, out.begin() + r * count);
  return out;
}

struct LinearCase {
  int ranks;
  bool sequence_parallel;
};

class ParallelLinearTest : public ::testing::TestWithParam<LinearCase> {};

// Column-parallel then row-parallel, each checked against the unsplit GEMMs: outputs, input
// gradients and weight gradients (the canonical Megatron MLP pair, f ... g). The input gradients
// also written whole (`accumulate` false) into buffers holding NaN, and added onto earlier values:
// on one rank the GEMM writes or adds, across ranks the f operator's sum is copied or added.
TEST_P(ParallelLinearTest, ColumnAndRowParallelEqualTheUnsplitLayers) {
  const auto [ranks, sp] = GetParam();
  const int64_t rows = 12, in = 6, out = 8;  // rows split over ranks under sequence parallelism
  const auto x = loom::testing::random_vector(rows * in, 1), d_y = loom::testing::random_vector(rows * out, 2);
  const auto d_z = loom::testing::random_vector(rows * in, 3), earlier = loom::testing::random_vector(rows * out, 4);
  // Reference: y = x A^T + a (A: [out, in]); z = y B^T + b (B: [in, out]).
  ParameterStore ref;
  const auto [A, a, B, b] = model::testing::add_linear_pair(ref, in, out, 0.5f);
  std::vector<float> y(rows * out), z(rows * in), d_x(rows * in, 0.0f), d_y_from_z(rows * out, 0.0f);
  namespace k = kernels::cpu;
  k::linear_forward(y.data(), x.data(), ref.value(A), ref.value(a), rows, in, out);
  k::linear_forward(z.data(), y.data(), ref.value(B), ref.value(b), rows, out, in);
  k::linear_backward(d_x.data(), ref.grad(A), ref.grad(a), d_y.data(), x.data(), ref.value(A), rows, in, out);
  k::linear_backward(d_y_from_z.data(), ref.grad(B), ref.grad(b), d_z.data(), y.data(), ref.value(B), rows, out, in);

  std::mutex mutex;
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    TensorParallel tp(&world, sp);
    const int64_t part = out / ranks, start = world.rank() * part;
    const int64_t local = tp.local_rows(rows), first = tp.first_local_row(rows);
    ParameterStore store;
    const auto [la, lab, lb, lbb] = model::testing::add_sharded_linear_pair(store, tp, in, out, start, part, 0.5f);
    ColumnParallelLinear column(store, tp, la, lab, in, part);
    RowParallelLinear row(store, tp, lb, lbb, part, in);
    ParallelScratch scratch;

    const float* x_local = x.data() + first * in;
    std::vector<float> y_local(rows * part), z_local(local * in, 0.0f);
    column.forward(y_local.data(), x_local, rows, scratch);
    const std::vector<float> y_ref = columns(y, rows, out, start, part);
    // The row-parallel layer takes the reference's y slice, so each layer is checked on its own.
    row.forward(z_local.data(), y_ref.data(), rows, scratch);
    std::vector<float> d_x_local(local * in, 0.0f), d_y_local(rows * part, 0.0f);
    const std::vector<float> d_y_ref = columns(d_y, rows, out, start, part);
    column.backward(d_x_local.data(), d_y_ref.data(), x_local, rows, scratch);
    row.backward(d_y_local.data(), d_z.data() + first * in, y_ref.data(), rows, scratch);
    // The row-parallel bias saw this rank's rows only under sequence parallelism.
    std::vector<float> bias_grad(store.grad(lbb), store.grad(lbb) + in);
    if (sp) tp.all_reduce(bias_grad.data(), in);
    const std::vector<float> grad_la(store.grad(la), store.grad(la) + part * in);
    const std::vector<float> grad_lab(store.grad(lab), store.grad(lab) + part);
    const std::vector<float> grad_lb(store.grad(lb), store.grad(lb) + in * part);
    // Input gradients written whole, then added onto earlier values (weight gradients add again).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> d_x_written(local * in, nan), d_y_written(rows * part, nan);
    column.backward(d_x_written.data(), d_y_ref.data(), x_local, rows, scratch, false);
    row.backward(d_y_written.data(), d_z.data() + first * in, y_ref.data(), rows, scratch, false);
    const std::vector<float> earlier_x(earlier.begin() + first * in, earlier.begin() + (first + local) * in);
    const std::vector<float> earlier_y = columns(earlier, rows, out, start, part);
    std::vector<float> d_x_added = earlier_x, d_y_added = earlier_y;
    column.backward(d_x_added.data(), d_y_ref.data(), x_local, rows, scratch, true);
    row.backward(d_y_added.data(), d_z.data() + first * in, y_ref.data(), rows, scratch, true);
    for (size_t i = 0; i < d_x_added.size(); ++i) d_x_added[i] -= earlier_x[i];
    for (size_t i = 0; i < d_y_added.size(); ++i) d_y_added[i] -= earlier_y[i];

    std::lock_guard<std::mutex> lock(mutex);
    SCOPED_TRACE("rank " + std::to_string(world.rank()));
    EXPECT_LE(relative_difference(y_local.data(), y_ref.data(), rows * part), 1e-6);
    EXPECT_LE(relative_difference(z_local.data(), z.data() + first * in, local * in), 1e-6);
    const std::vector<float> d_y_from_z_ref = columns(d_y_from_z, rows, out, start, part);
    for (const auto* got : {&d_x_local, &d_x_written})
      EXPECT_LE(relative_difference(got->data(), d_x.data() + first * in, local * in), 1e-6);
    for (const auto* got : {&d_y_local, &d_y_written})
      EXPECT_LE(relative_difference(got->data(), d_y_from_z_ref.data(), rows * part), 1e-6);
    // Added onto earlier values and taken off again: their rounding on top.
    EXPECT_LE(relative_difference(d_x_added.data(), d_x.data() + first * in, local * in), 1e-5);
    EXPECT_LE(relative_difference(d_y_added.data(), d_y_from_z_ref.data(), rows * part), 1e-5);
    EXPECT_LE(relative_difference(grad_la.data(), ref.grad(A) + start * in, part * in), 1e-6);
    EXPECT_LE(relative_difference(grad_lab.data(), ref.grad(a) + start, part), 1e-6);
    const std::vector<float> grad_b = columns(std::vector<float>(ref.grad(B), ref.grad(B) + in * out), in, out, start, part);
    EXPECT_LE(relative_difference(grad_lb.data(), grad_b.data(), in * part), 1e-6);
    EXPECT_LE(relative_difference(bias_grad.data(), ref.grad(b), in), 1e-6);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelLinearTest,
                         ::testing::Values(LinearCase{1, false}, LinearCase{2, false}, LinearCase{2, true},
                                           LinearCase{4, false}, LinearCase{4, true}),
                         [](const auto& info) {
                           return "tp" + std::to_string(info.param.ranks) + (info.param.sequence_parallel ? "_sp" : "");
                         });

// Vocabulary-parallel cross-entropy over an uneven split of 37 ids: losses and the gradient of
// each rank's logits equal the fused kernel's on the full rows; no rank holds a full row.
TEST(VocabParallel, CrossEntropyEqualsTheFullSoftmax) {
  namespace k = kernels::cpu;
  const int64_t rows = 9, vocab = 37;
  auto logits = loom::testing::random_vector(rows * vocab, 5, 3.0f);
  std::vector<int32_t> targets = {0, 36, 5, k::kIgnoreIndex, 18, 19, 20, 1, 35};
  std::vector<float> grad = logits, losses(rows);
  const double total = k::softmax_cross_entropy(grad.data(), losses.data(), targets.data(), rows, vocab, 0.25f);
  for (int ranks : {2, 3, 4}) {
    std::mutex mutex;
    comm::launch(threads(ranks), [&](comm::Communicator& world) {
      TensorParallel tp(&world, false);
      const int64_t first = balanced_first(vocab, ranks, world.rank());
      const int64_t count = balanced_first(vocab, ranks, world.rank() + 1) - first;
      std::vector<float> shard = columns(logits, rows, vocab, first, count), row_max(rows), stats(2 * rows),
                         shard_losses(rows);
      k::vocab_shard_row_max(shard.data(), rows, count, row_max.data());
      tp.all_reduce_max(row_max.data(), rows);
      k::vocab_shard_exp_sums(shard.data(), row_max.data(), targets.data(), rows, count, first, stats.data());
      tp.all_reduce(stats.data(), 2 * rows);
      const double sum = k::vocab_shard_finish(shard.data(), shard_losses.data(), row_max.data(), stats.data(),
                                               targets.data(), rows, count, first, 0.25f);
      const std::vector<float> expected_grad = columns(grad, rows, vocab, first, count);
      std::lock_guard<std::mutex> lock(mutex);
      EXPECT_NEAR(sum, total, 1e-5 * total) << "tp " << ranks;
      EXPECT_LE(relative_difference(shard_losses.data(), losses.data(), rows), 1e-6) << "tp " << ranks;
      EXPECT_LE(relative_difference(shard.data(), expected_grad.data(), rows * count), 1e-5) << "tp " << ranks;
    });
  }
}

// Vocabulary-parallel embedding: the sum over shards of each shard's lookup is the full lookup,
// and each shard's gradient rows are the full gradient's.
TEST(VocabParallel, EmbeddingShardsSumToTheFullLookup) {
  namespace k = kernels::cpu;
  const int64_t vocab = 11, dim = 4, rows = 7;
  const auto table = loom::testing::random_vector(vocab * dim, 8), d_out = loom::testing::random_vector(rows * dim, 9);
  const std::vector<int32_t> ids = {0, 10, 3, 3, 7, 5, 10};
  std::vector<float> full(rows * dim), d_table(vocab * dim, 0.0f);
  k::embedding_forward(full.data(), ids.data(), table.data(), rows, dim, false);
  k::embedding_backward(d_table.data(), d_out.data(), ids.data(), rows, dim);
  std::vector<float> sum(rows * dim, 0.0f), out(rows * dim);
  for (int p = 0; p < 3; ++p) {
    const int64_t first = balanced_first(vocab, 3, p), count = balanced_first(vocab, 3, p + 1) - first;
    k::embedding_forward_shard(out.data(), ids.data(), table.data() + first * dim, rows, dim, first, count);
    for (int64_t i = 0; i < rows * dim; ++i) sum[i] += out[i];
    std::vector<float> d_shard(count * dim, 0.0f);
    k::embedding_backward_shard(d_shard.data(), d_out.data(), ids.data(), rows, dim, first, count);
    EXPECT_LE(relative_difference(d_shard.data(), d_table.data() + first * dim, count * dim), 0.0) << "shard " << p;
  }
  EXPECT_LE(relative_difference(sum.data(), full.data(), rows * dim), 0.0);
}

config::ModelConfig gpt2_style() {
  config::ModelConfig c;
  c.vocab_size = 61;  // uneven over 2 and 4 ranks
  c.d_model = 32;
  c.layers = 2;
  c.heads = 4;
  c.ffn_size = 64;
  c.norm = config::Norm::Layer;
  c.activation = config::Activation::Gelu;
  c.positions = config::Positions::Learned;
  c.bias = true;
  c.max_seq_len = 16;
  return c;
}

config::ModelConfig llama_hetero() {
  config::ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 32;
  c.layers = 3;
  c.heads = 8;
  c.kv_heads = 2;  // fewer kv heads than 4 ranks: replicated
  c.ffn_size = 48;
  c.tied_embeddings = false;
  c.max_seq_len = 16;
  using Attention = config::BlockAttention;
  c.block_configs = {{Attention::Normal, 0, -1}, {Attention::Skip, 0, 32}, {Attention::Normal, 4, 0}};
  return c;
}

// One forward_backward of a whole model at tp = ranks equals tp = 1: the loss, and every
// parameter's gradient on its slice.
void expect_model_matches_one_rank(const config::ModelConfig& config, int ranks, bool sp, bool recompute = false) {
  config::ModelConfig c = config;
  c.recompute = recompute;
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = i == 5 ? kernels::cpu::kIgnoreIndex : static_cast<int32_t>((i * 13 + 1) % c.vocab_size);
  }
  Transformer one(c);
  one.initialize(11);
  one.params().zero_grads();
  const double loss = one.forward_backward(inputs.data(), targets.data(), batch, seq, 0.1f);
  std::mutex mutex;
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    Transformer model(c, TensorParallel(&world, sp));
    model.initialize(11);
    model.params().zero_grads();
    // Twice: the second micro-batch accumulates onto the first's (synced) gradients.
    double mine = model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.05f);
    mine += model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.05f);
    std::lock_guard<std::mutex> lock(mutex);
    SCOPED_TRACE("rank " + std::to_string(world.rank()));
    EXPECT_NEAR(mine, 2 * loss, 1e-5 * loss);
    for (const Parameter& p : model.params().list()) {
      const int id = one.params().find(p.name);
      ASSERT_GE(id, 0) << p.name;
      std::vector<float> expected(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) expected[i] = one.params().grad(id)[global_index(p.shard, p.shape, i)];
      std::vector<float> values(p.numel);
      for (int64_t i = 0; i < p.numel; ++i) values[i] = one.params().value(id)[global_index(p.shard, p.shape, i)];
      EXPECT_LE(relative_difference(model.params().value(model.params().find(p.name)), values.data(), p.numel), 0.0)
          << p.name << ": initial values differ";
      // Relative to the gradients' scale (~1e-2) at least, not only the tensor's own: a key bias's
      // gradient is rounding noise around zero (softmax ignores a shift shared by all keys).
      const float* grad = model.params().grad(model.params().find(p.name));
      double diff = 0.0, scale = 1e-2;
      for (int64_t i = 0; i < p.numel; ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(grad[i] - expected[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(expected[i])));
      }
      EXPECT_LE(diff / scale, 1e-5)
          << p.name;
    }
  });
}

// The contiguous runs a shard's copies move are where global_index puts each element.
TEST(ShardSpec, RunsPlaceEveryElementAtItsGlobalIndex) {
  const Shape global = {3, 8, 5};
  for (int dim = -1; dim < 3; ++dim) {
    ShardSpec spec;
    Shape local = global;
    if (dim >= 0) {
      spec.global_shape = global;
      spec.split_dim = dim;
      spec.length = global[dim] / 2 + (dim == 1 ? 1 : 0);
      spec.start = global[dim] - spec.length;  // the last slice: a wrong offset or stride shows
      local[dim] = spec.length;
    }
    const ShardRuns runs = shard_runs(spec, local);
    ASSERT_EQ(runs.count * runs.length, shape_numel(local)) << "split dim " << dim;
    for (int64_t i = 0; i < shape_numel(local); ++i) {
      const int64_t k = i / runs.length;
      EXPECT_EQ(runs.first + k * runs.global_stride + i % runs.length, global_index(spec, local, i))
          << "split dim " << dim << ", element " << i;
    }
  }
}

TEST(TensorParallelModel, Gpt2StyleEqualsOneRank) {
  for (int ranks : {2, 4})
    for (bool sp : {false, true}) {
      SCOPED_TRACE("tp " + std::to_string(ranks) + (sp ? " sp" : ""));
      expect_model_matches_one_rank(gpt2_style(), ranks, sp);
    }
}

TEST(TensorParallelModel, HeterogeneousLlamaWithGqaEqualsOneRank) {
  for (int ranks : {2, 4})
    for (bool sp : {false, true}) {
      SCOPED_TRACE("tp " + std::to_string(ranks) + (sp ? " sp" : ""));
      expect_model_matches_one_rank(llama_hetero(), ranks, sp);
    }
  expect_model_matches_one_rank(llama_hetero(), 4, true, /*recompute=*/true);
}

// Qwen 2: q/k/v biases split with their heads (kv heads replicated at tp 4), no o_proj bias.
TEST(TensorParallelModel, Qwen2QkvBiasEqualsOneRank) {
  config::ModelConfig c = llama_hetero();
  c.block_configs.clear();
  c.qkv_bias = true;
  const Transformer model(c);
  EXPECT_GE(model.params().find("model.layers.0.self_attn.v_proj.bias"), 0);
  EXPECT_LT(model.params().find("model.layers.0.self_attn.o_proj.bias"), 0);
  for (int ranks : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(ranks));
    expect_model_matches_one_rank(c, ranks, ranks == 4);
  }
}

// Sequence parallelism keeps the residual stream, norms and their saved inputs split by rows.
TEST(TensorParallelModel, SequenceParallelDividesActivationMemory) {
  config::ModelConfig c = llama_hetero();
  c.block_configs.clear();
  const int64_t batch = 2, seq = 16;
  std::vector<int32_t> tokens(batch * seq, 1);
  int64_t bytes[2] = {0, 0};
  for (bool sp : {false, true}) {
    comm::launch(threads(4), [&](comm::Communicator& world) {
      Transformer model(c, TensorParallel(&world, sp));
      model.initialize(1);
      model.forward_loss(tokens.data(), tokens.data(), batch, seq);
      if (world.rank() == 0) bytes[sp] = model.activation_bytes();
    });
  }
  EXPECT_LT(bytes[1], bytes[0]);
}

TEST(TensorParallelModel, UnsplittableLayersAreErrorsNamingTheLayer) {
  config::ModelConfig c = llama_hetero();
  c.block_configs[1].ffn_size = 30;  // 30 / 4 ranks
  try {
    comm::launch(threads(4), [&](comm::Communicator& world) { Transformer model(c, TensorParallel(&world, false)); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ffn_size 30"), std::string::npos) << e.what();
  }
  c = llama_hetero();
  c.heads = 6;
  c.kv_heads = 3;
  c.block_configs.clear();
  c.d_model = 36;
  try {
    comm::launch(threads(4), [&](comm::Communicator& world) { Transformer model(c, TensorParallel(&world, false)); });
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("6 attention heads"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::model
