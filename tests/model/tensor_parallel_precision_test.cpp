// Mixed precision under tensor parallelism computes what one rank computes: column- and
// row-parallel linears (tp 2 and 4, with and without sequence parallelism) in every quantizing
// recipe against the unsplit LinearPrecision GEMMs, forward and backward; an attention layer whose
// kv heads are replicated over ranks; whole models at tp 2 and 4 against one rank; and a split
// that would cut the blocks of a block-scaled recipe is an Error naming the projection. Ranks are
// threads.
//
// What "the same" means: every operand is quantized exactly as one rank quantizes it (per-tensor
// scales from the whole tensor's amax, blocks that do not straddle the split), and a GEMM whose
// reduction is split sums its fp32 partial products before the one rounding to bf16/fp16. Only
// the fp32 summation order differs, so results agree to 1e-6, except that a sum lying within
// that difference of a rounding boundary of the output dtype may round the other way: a rare
// flip of one bf16 ulp (about 1e-4 of the elements for these sizes; we allow 1%). Quantizing
// one shard differently (by its own amax) or rounding partial sums changes most elements.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/model/attention.h"
#include "loom/model/linear_precision.h"
#include "loom/model/parallel_linear.h"
#include "loom/model/tensor_parallel_grads.h"
#include "loom/model/transformer.h"
#include "linear_pair.h"
#include "support/thread_ranks.h"

namespace loom::model {
namespace {

using loom::testing::threads;

std::vector<float> random_values(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Columns [start, start + count) of a row-major [rows, cols] matrix.
std::vector<float> columns(const float* m, int64_t rows, int64_t cols, int64_t start, int64_t count) {
  std::vector<float> out(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r) std::copy(m + r * cols + start, m + r * cols + start + count, out.begin() + r * count);
  return out;
}

// Multiplies columns [from, cols) of a row-major [rows, cols] matrix by `factor`: the pieces of a
// split tensor then have different amaxes, so a shard scaled by its own amax quantizes differently.
void scale_columns(float* m, int64_t rows, int64_t cols, int64_t from, float factor) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = from; c < cols; ++c) m[r * cols + c] *= factor;
}

// `got` equals `want` up to the fp32 summation order (1e-6 of the tensor's largest magnitude),
// but for at most 1% of the elements rounded one bf16 ulp the other way (see the file comment).
void expect_same_up_to_rounding_flips(const float* got, const float* want, int64_t n, const std::string& what) {
  double scale = 1e-30;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  int64_t flips = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (diff <= 1e-6 * scale) continue;
    ++flips;
    // One bf16 ulp of |want| is at most 2^-7 |want| (fp16's 2^-10 is smaller).
    if (diff > std::ldexp(std::fabs(static_cast<double>(want[i])), -7) * (1.0 + 1e-6)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", one rank has " << want[i]
                    << " (more than a rounding flip apart)";
      return;
    }
  }
  EXPECT_LE(flips, std::max<int64_t>(1, n / 100)) << what << ": " << flips << " of " << n << " elements differ";
}

struct PrecisionCase {
  Recipe recipe;
  int ranks;
  bool sequence_parallel;
};

class ParallelLinearPrecisionTest : public ::testing::TestWithParam<PrecisionCase> {};

// Column-parallel then row-parallel (f ... g) in the recipe, each checked on its own against
// LinearPrecision on the unsplit tensors: outputs, input gradients, weight and bias gradients.
TEST_P(ParallelLinearPrecisionTest, ColumnAndRowParallelEqualOneRank) {
  const auto [recipe, ranks, sp] = GetParam();
  // out splits into 128 (tp 2) or 64 (tp 4) features: whole 128- and 32-blocks; `in` is ragged
  // for both block sizes but never split.
  const int64_t rows = 16, in = 80, out = 256;
  const std::vector<float> x = random_values(rows * in, 1.0f, 1);
  std::vector<float> d_y = random_values(rows * out, 0.01f, 2);
  const std::vector<float> d_z = random_values(rows * in, 0.01f, 3);
  scale_columns(d_y.data(), rows, out, out / 2, 4.0f);
  // Reference: y = x A^T + a (A: [out, in]); z = y B^T + b (B: [in, out]). The second half of
  // A's rows and of B's columns (the last ranks' pieces) is larger.
  ParameterStore ref;
  const auto [A, a, B, b] = model::testing::add_linear_pair(ref, in, out, 0.1f);
  scale_columns(ref.value(A), 1, out * in, out / 2 * in, 4.0f);
  scale_columns(ref.value(B), in, out, out / 2, 4.0f);
  std::vector<float> y(rows * out), z(rows * in), d_x(rows * in, 0.0f), d_y_from_z(rows * out, 0.0f);
  LinearPrecision one_a(recipe), one_b(recipe);
  one_a.forward(y.data(), x.data(), ref.value(A), ref.value(a), rows, in, out);
  one_b.forward(z.data(), y.data(), ref.value(B), ref.value(b), rows, out, in);
  one_a.backward(d_x.data(), ref.grad(A), ref.grad(a), d_y.data(), x.data(), ref.value(A), rows, in, out);
  one_b.backward(d_y_from_z.data(), ref.grad(B), ref.grad(b), d_z.data(), y.data(), ref.value(B), rows, out, in);

  std::mutex mutex;
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    TensorParallel tp(&world, sp);
    const int64_t part = out / ranks, start = world.rank() * part;
    const int64_t local = tp.local_rows(rows), first = tp.first_local_row(rows);
    ParameterStore store;
    const auto [la, lab, lb, lbb] = model::testing::add_sharded_linear_pair(store, tp, in, out, start, part, 0.1f);
    if (start >= out / 2) {
      scale_columns(store.value(la), 1, part * in, 0, 4.0f);
      scale_columns(store.value(lb), in, part, 0, 4.0f);
    }
    ColumnParallelLinear column(store, tp, la, lab, in, part);
    RowParallelLinear row(store, tp, lb, lbb, part, in);
    column.set_precision(std::make_shared<LinearPrecision>(recipe));
    row.set_precision(std::make_shared<LinearPrecision>(recipe));
    ParallelScratch scratch;

    const float* x_local = x.data() + first * in;
    std::vector<float> y_local(rows * part), z_local(local * in, 0.0f);
    column.forward(y_local.data(), x_local, rows, scratch);
    const std::vector<float> y_ref = columns(y.data(), rows, out, start, part);
    row.forward(z_local.data(), y_ref.data(), rows, scratch);
    std::vector<float> d_x_local(local * in, 0.0f), d_y_local(rows * part, 0.0f);
    const std::vector<float> d_y_ref = columns(d_y.data(), rows, out, start, part);
    column.backward(d_x_local.data(), d_y_ref.data(), x_local, rows, scratch);
    row.backward(d_y_local.data(), d_z.data() + first * in, y_ref.data(), rows, scratch);
    std::vector<float> bias_grad(store.grad(lbb), store.grad(lbb) + in);
    if (sp) tp.all_reduce(bias_grad.data(), in);

    std::lock_guard<std::mutex> lock(mutex);
    SCOPED_TRACE("rank " + std::to_string(world.rank()));
    expect_same_up_to_rounding_flips(y_local.data(), y_ref.data(), rows * part, "column forward");
    expect_same_up_to_rounding_flips(z_local.data(), z.data() + first * in, local * in, "row forward");
    expect_same_up_to_rounding_flips(d_x_local.data(), d_x.data() + first * in, local * in, "column dgrad");
    const std::vector<float> d_y_from_z_ref = columns(d_y_from_z.data(), rows, out, start, part);
    expect_same_up_to_rounding_flips(d_y_local.data(), d_y_from_z_ref.data(), rows * part, "row dgrad");
    expect_same_up_to_rounding_flips(store.grad(la), ref.grad(A) + start * in, part * in, "column wgrad");
    expect_same_up_to_rounding_flips(store.grad(lab), ref.grad(a) + start, part, "column bias grad");
    const std::vector<float> grad_b = columns(ref.grad(B), in, out, start, part);
    expect_same_up_to_rounding_flips(store.grad(lb), grad_b.data(), in * part, "row wgrad");
    expect_same_up_to_rounding_flips(bias_grad.data(), ref.grad(b), in, "row bias grad");
  });
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, ParallelLinearPrecisionTest,
    ::testing::Values(PrecisionCase{Recipe::Bf16, 2, false}, PrecisionCase{Recipe::Fp16, 2, true},
                      PrecisionCase{Recipe::Fp8Delayed, 2, false}, PrecisionCase{Recipe::Fp8Current, 2, false},
                      PrecisionCase{Recipe::Fp8Current, 2, true}, PrecisionCase{Recipe::Fp8Current, 4, true},
                      PrecisionCase{Recipe::Fp8Blockwise, 2, false}, PrecisionCase{Recipe::Fp8Blockwise, 2, true},
                      PrecisionCase{Recipe::Mxfp8, 2, false}, PrecisionCase{Recipe::Mxfp8, 2, true},
                      PrecisionCase{Recipe::Mxfp8, 4, false}),
    [](const auto& info) {
      return recipe_name(info.param.recipe) + "_tp" + std::to_string(info.param.ranks) +
             (info.param.sequence_parallel ? "_sp" : "");
    });

// A model whose every split falls on 128-element boundaries at tp 2: head_dim 128 (one query
// and one kv head per rank), ffn 256 (128 per rank).
config::ModelConfig block_aligned_llama() {
  config::ModelConfig c;
  c.vocab_size = 40;
  c.d_model = 256;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 2;
  c.ffn_size = 256;
  c.max_seq_len = 16;
  c.init_std = 0.05;
  return c;
}

// max |a - b| / max |b| over this rank's slice of parameter `p` (a: local, b: global gradient).
double slice_difference(const float* a, const float* b, const Parameter& p) {
  double diff = 0.0, scale = 1e-30;
  for (int64_t i = 0; i < p.numel; ++i) {
    const float expected = b[global_index(p.shard, p.shape, i)];
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - expected)));
    scale = std::max(scale, static_cast<double>(std::fabs(expected)));
  }
  return diff / scale;
}

// Whole models at tp 2 (with and without sequence parallelism), fused [q; k; v] and [gate; up]
// included, against one rank in each recipe. The layers are exact up to rounding flips (above),
// but a flip feeds the next layers and FP8 amplifies it: an amax or a block's maximum that moves
// by one bf16 ulp rescales a whole tensor or block, moving a share of its elements by one FP8
// step (up to 2^-2 for E5M2 gradients). So this is a check at the scale of the recipe's own
// error: the loss within 1e-3 (measured: 1.3e-4 for fp8_blockwise, whose block maxima are the
// most sensitive, 7.9e-5 for fp8_current, <= 1.2e-8 for the others), and every
// gradient no further from one rank's than twice one rank's own distance from fp32 (measured:
// at most 1.1 times; 0.5% to 16% of the gradient's largest magnitude).
TEST(TensorParallelPrecisionModel, RecipesAtTp2StayWithinTheirOwnQuantizationError) {
  const config::ModelConfig c = block_aligned_llama();
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 13 + 1) % c.vocab_size);
  }
  auto one_rank = [&](Recipe recipe, double* loss) {
    auto model = std::make_unique<Transformer>(c, TensorParallel(), PrecisionPolicy{recipe, 16, 0, false});
    model->initialize(11);
    model->params().zero_grads();
    *loss = model->forward_backward(inputs.data(), targets.data(), batch, seq, 0.1f);
    return model;
  };
  double loss = 0.0;
  const std::unique_ptr<Transformer> fp32 = one_rank(Recipe::Fp32, &loss);
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp8Delayed, Recipe::Fp8Current, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    const std::unique_ptr<Transformer> one = one_rank(recipe, &loss);
    for (bool sp : {false, true}) {
      const std::string layout = recipe_name(recipe) + " at tp 2" + (sp ? " sp" : "");
      std::mutex mutex;
      comm::launch(threads(2), [&](comm::Communicator& world) {
        Transformer model(c, TensorParallel(&world, sp), PrecisionPolicy{recipe, 16, 0, false});
        model.initialize(11);
        model.params().zero_grads();
        const double mine = model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.1f);
        std::lock_guard<std::mutex> lock(mutex);
        SCOPED_TRACE(layout + ", rank " + std::to_string(world.rank()));
        EXPECT_NEAR(mine, loss, 1e-3 * loss);
        for (const Parameter& p : model.params().list()) {
          const float* reference = one->params().grad(one->params().find(p.name));
          const float* in_fp32 = fp32->params().grad(fp32->params().find(p.name));
          std::vector<float> own(p.numel);  // one rank's gradient in the recipe, on this slice
          for (int64_t i = 0; i < p.numel; ++i) own[i] = reference[global_index(p.shard, p.shape, i)];
          const double split = slice_difference(model.params().grad(model.params().find(p.name)), reference, p);
          EXPECT_LE(split, 2.0 * slice_difference(own.data(), in_fp32, p)) << p.name;
        }
      });
    }
  }
}

// Four heads of 128 over two kv heads, ffn 512: every split at tp 2 and 4 falls on 128-element
// boundaries, and at tp 4 each kv head is replicated on two ranks.
config::ModelConfig replicated_kv_llama() {
  config::ModelConfig c = block_aligned_llama();
  c.d_model = 512;
  c.heads = 4;
  c.ffn_size = 512;
  return c;
}

// One attention layer of replicated_kv_llama's shape at tp 4 (kv heads replicated on two ranks)
// against one rank, forward and backward, in each recipe. Each holder of a kv head sees the
// gradient of its own query heads only; the holders' partial gradients are summed in fp32 before
// the q/k/v projection casts them (Attention::backward), so the projection's input gradient
// equals one rank's up to rounding flips (file comment) and every weight gradient up to the fp32
// summation order (measured: at most 2.1e-7 of a gradient's largest magnitude). Casting the
// partial gradients instead moved most elements of the input gradient, and the k and v weight
// gradients by 2.4e-3 (bf16) to 1.2e-1 (FP8) of their largest magnitude.
TEST(TensorParallelPrecisionModel, ReplicatedKvHeadsSumTheirGradientsBeforeTheCast) {
  const int64_t batch = 2, seq = 8, rows = batch * seq, d = 512;
  const std::vector<float> x = random_values(rows * d, 1.0f, 4);
  const std::vector<float> d_residual = random_values(rows * d, 0.01f, 5);
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp8Delayed, Recipe::Fp8Current, Recipe::Mxfp8, Recipe::Fp8Blockwise}) {
    SCOPED_TRACE(recipe_name(recipe));
    const PrecisionPolicy policy{recipe, 16, 0, false};
    // Runs the layer on `store` (all ranks' rows in, this rank's rows of d_normed out).
    auto run = [&](ParameterStore& store, const TensorParallel& tp, std::vector<float>& d_normed) {
      Attention attention(store, tp, 0, "attn", d, 4, 2, false, false, nullptr, 0.05f, 0.05f);
      store.allocate();
      store.initialize(7);
      store.zero_grads();
      PrecisionContext context(policy);
      attention.set_precision(context, recipe, "attn");
      attention.set_operands(policy.attention_operands());
      std::vector<int> ids(store.list().size());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
      TensorParallelGrads holders(store, tp, {ids});
      Attention::Saved saved;
      Workspace work;
      ParallelScratch scratch;
      std::vector<float> residual(rows * d, 0.0f);
      attention.forward(saved, residual.data(), NormedRows(x.data()), batch, seq, Packing{}, scratch);
      holders.begin_unit(0);
      d_normed.assign(rows * d, 0.0f);
      attention.backward(d_normed.data(), d_residual.data(), NormedRows(x.data()), saved, work, batch, seq, Packing{},
                         scratch);
      holders.finish_unit(0);
    };
    ParameterStore one;
    std::vector<float> d_normed_one;
    run(one, TensorParallel(), d_normed_one);
    std::mutex mutex;
    comm::launch(threads(4), [&](comm::Communicator& world) {
      ParameterStore store;
      const TensorParallel tp(&world, false);
      std::vector<float> d_normed;
      run(store, tp, d_normed);
      std::lock_guard<std::mutex> lock(mutex);
      SCOPED_TRACE("rank " + std::to_string(world.rank()));
      expect_same_up_to_rounding_flips(d_normed.data(), d_normed_one.data(), rows * d, "q/k/v dgrad");
      for (const Parameter& p : store.list()) {
        EXPECT_LE(slice_difference(store.grad(store.find(p.name)), one.grad(one.find(p.name)), p), 1e-6) << p.name;
      }
    });
  }
}

// One step's loss and the largest max |a - b| / max |b| over the parameter gradients (every
// rank's slices) of a split model against one rank.
struct StepAgreement {
  double loss = 0.0, grads = 0.0;
};

StepAgreement step_agreement(const config::ModelConfig& c, Recipe recipe, int ranks, bool sp) {
  const int64_t batch = 2, seq = 8;
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
    targets[i] = static_cast<int32_t>((i * 13 + 1) % c.vocab_size);
  }
  const PrecisionPolicy policy{recipe, 16, 0, false};
  Transformer one(c, TensorParallel(), policy);
  one.initialize(11);
  one.params().zero_grads();
  const double loss = one.forward_backward(inputs.data(), targets.data(), batch, seq, 0.1f);
  StepAgreement agreement;
  std::mutex mutex;
  comm::launch(threads(ranks), [&](comm::Communicator& world) {
    Transformer model(c, TensorParallel(&world, sp), policy);
    model.initialize(11);
    model.params().zero_grads();
    const double mine = model.forward_backward(inputs.data(), targets.data(), batch, seq, 0.1f);
    std::lock_guard<std::mutex> lock(mutex);
    agreement.loss = std::max(agreement.loss, std::fabs(mine - loss) / loss);
    for (const Parameter& p : model.params().list()) {
      const float* reference = one.params().grad(one.params().find(p.name));
      agreement.grads =
          std::max(agreement.grads, slice_difference(model.params().grad(model.params().find(p.name)), reference, p));
    }
  });
  return agreement;
}

// One step of replicated_kv_llama at tp 2 (one kv head per rank) and tp 4 (each kv head on two
// ranks), with and without sequence parallelism, against one rank: the loss and every parameter
// gradient. The head's input gradient and the replicated kv heads' gradients are summed over the
// ranks before they are rounded or cast, so what remains are the rounding flips of the fp32
// summation order (file comment), and what they become downstream. fp8_delayed and mxfp8 absorb
// them: their gradients agree to 1e-4 (measured: at most 6e-5; casting the kv heads' partial
// gradients gave 2e-1 and 1e-1 at tp 4). Under bf16 a flip moves every gradient of the rows it
// reaches by about a bf16 ulp (measured: 5.5e-3 of a gradient's largest magnitude); under
// fp8_current and fp8_blockwise it can move an amax or a block maximum, rescaling a whole tensor
// or block (measured: 1.2e-1 and 1.3e-1). The loss agrees to 1e-6 (measured: at most 1.4e-8),
// except under fp8_blockwise at tp 4 (measured: 5.7e-4). Rounding the head's partial input
// gradients before their sum gave 1.6e-1 (fp8_delayed) and 1.2e-1 (mxfp8) already at tp 2.
TEST(TensorParallelPrecisionModel, OneStepAtTp2AndTp4AgreesWithOneRank) {
  const config::ModelConfig c = replicated_kv_llama();
  const std::vector<std::tuple<Recipe, double, double>> bounds = {
      {Recipe::Bf16, 1e-6, 2e-2},        {Recipe::Fp8Delayed, 1e-6, 1e-4},   {Recipe::Mxfp8, 1e-6, 1e-4},
      {Recipe::Fp8Current, 1e-6, 2.5e-1}, {Recipe::Fp8Blockwise, 1e-3, 2.5e-1}};
  for (const auto& [recipe, loss_bound, grad_bound] : bounds) {
    for (int ranks : {2, 4}) {
      for (bool sp : {false, true}) {
        const StepAgreement a = step_agreement(c, recipe, ranks, sp);
        const std::string layout = recipe_name(recipe) + " at tp " + std::to_string(ranks) + (sp ? " sp" : "");
        EXPECT_LE(a.loss, loss_bound) << layout;
        EXPECT_LE(a.grads, grad_bound) << layout;
      }
    }
  }
}

// Splits that cut blocks: the layer is named with the dimension, the sizes and the block.
TEST(TensorParallelPrecisionModel, SplitsThatCutBlocksAreErrorsNamingTheLayer) {
  auto error_of = [](const config::ModelConfig& c, Recipe recipe) -> std::string {
    try {
      comm::launch(threads(2), [&](comm::Communicator& world) {
        Transformer model(c, TensorParallel(&world, false), PrecisionPolicy{recipe, 16, 0, false});
      });
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  config::ModelConfig c = block_aligned_llama();
  c.d_model = 128;  // head_dim 64: each rank's 64 query features are half a 128-block
  std::string message = error_of(c, Recipe::Fp8Blockwise);
  ASSERT_FALSE(message.empty()) << "expected an error";
  for (const char* part : {"model.layers.0.self_attn.q_proj", "fp8_blockwise", "blocks of 128", "output features",
                           "64 of its 128"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  EXPECT_TRUE(error_of(c, Recipe::Mxfp8).empty()) << "64 is a whole number of 32-blocks";
  EXPECT_TRUE(error_of(c, Recipe::Fp8Current).empty()) << "per-tensor scales fit any split";

  // The MLP's split: query and kv features (32 per rank) are whole 32-blocks, the 48 ffn
  // features per rank are not (gate_proj, of the fused [gate; up], is the first weight cut).
  c = block_aligned_llama();
  c.d_model = 64;
  c.ffn_size = 96;
  message = error_of(c, Recipe::Mxfp8);
  ASSERT_FALSE(message.empty()) << "expected an error";
  EXPECT_NE(message.find("model.layers.0.mlp.gate_proj"), std::string::npos) << message;
  EXPECT_NE(message.find("48 of its 96 output features"), std::string::npos) << message;

  // A row-parallel layer on its own (in a model, the column-parallel layer before it holds the
  // same features and fails first): 48 input features per rank.
  message.clear();
  std::mutex mutex;
  comm::launch(threads(2), [&](comm::Communicator& world) {
    TensorParallel tp(&world, false);
    ParameterStore store;
    const int w = store.add("proj.weight", {16, 48}, Init::Normal, 0.1f, tp.split({16, 96}, 1, world.rank() * 48, 48));
    store.allocate();
    RowParallelLinear row(store, tp, w, -1, 48, 16);
    try {
      row.set_precision(std::make_shared<LinearPrecision>(Recipe::Mxfp8));
    } catch (const Error& e) {
      std::lock_guard<std::mutex> lock(mutex);
      message = e.what();
    }
  });
  EXPECT_NE(message.find("proj: precision.recipe=mxfp8 scales blocks of 32 along the input features"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("48 of its 96 input features"), std::string::npos) << message;
}

}  // namespace
}  // namespace loom::model
