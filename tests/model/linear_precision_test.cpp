// Mixed precision in the linear layers' GEMMs (model/linear_precision.h): the prepared operands
// are exactly what each format represents (compared with the precision layer's functions
// directly), the emulated GEMMs equal fp32 GEMMs of independently quantized operands, delayed
// scaling uses the previous step's amaxes, and a model builds the recipe per layer.
#include "loom/model/linear_precision.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "loom/core/error.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/model/transformer.h"
#include "loom/precision/formats.h"
#include "loom/precision/mx.h"

namespace loom::model {
namespace {

namespace p = loom::precision;
namespace k = loom::kernels::cpu;

std::vector<float> random_values(int64_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  }
  return t;
}

// Bitwise equality (NaN-safe), reporting the first mismatch.
void expect_bitwise(const float* got, const std::vector<float>& want, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i];
      return;
    }
  }
}

bool any_difference(const float* a, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); ++i) {
    if (a[i] != b[i]) return true;
  }
  return false;
}

// What the recipe's operand `op` for GEMM `pass` must hold, from the precision layer directly.
std::vector<float> expected_operand(Recipe recipe, Operand op, GemmPass pass, std::vector<float> x, int64_t rows,
                                    int64_t cols, float delayed_scale = 1.0f) {
  const int64_t n = rows * cols;
  const bool grad = op == Operand::OutputGrad;
  switch (recipe) {
    case Recipe::Bf16:
      p::round_to_bf16(x.data(), n);
      break;
    case Recipe::Fp16:
      p::round_to_fp16(x.data(), n);
      break;
    case Recipe::Fp8Delayed:
      p::quantize_dequantize_fp8(x.data(), n, grad ? p::Fp8Format::E5M2 : p::Fp8Format::E4M3, delayed_scale);
      break;
    case Recipe::Fp8Current:
      p::CurrentScaling(grad ? p::Fp8Format::E5M2 : p::Fp8Format::E4M3).quantize_dequantize(x.data(), n);
      break;
    case Recipe::Fp8Blockwise:
      if (op == Operand::Weight) {
        p::quantize_dequantize_tile_blocks(x.data(), rows, cols, p::Fp8Format::E4M3, 128);
      } else if (pass == GemmPass::WeightGrad) {  // 128x1 blocks down the columns
        std::vector<float> t = transposed(x, rows, cols);
        p::quantize_dequantize_rowwise_blocks(t.data(), cols, rows, p::Fp8Format::E4M3, 128);
        x = transposed(t, cols, rows);
      } else {
        p::quantize_dequantize_rowwise_blocks(x.data(), rows, cols, p::Fp8Format::E4M3, 128);
      }
      break;
    case Recipe::Mxfp8:
      if ((op == Operand::Weight && pass == GemmPass::DataGrad) || pass == GemmPass::WeightGrad) {
        p::quantize_dequantize_mx_columns(x.data(), rows, cols, p::Fp8Format::E4M3);
      } else {
        p::quantize_dequantize_mx(x.data(), rows, cols, p::Fp8Format::E4M3);
      }
      break;
    case Recipe::Fp32:
      break;
  }
  return x;
}

const Recipe kQuantizing[] = {Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current,
                              Recipe::Fp8Blockwise, Recipe::Mxfp8};

TEST(LinearPrecision, RecipeNamesRoundTripAndFp32IsNoObject) {
  for (const char* name : {"fp32", "bf16", "fp16", "fp8_delayed", "fp8_current", "fp8_blockwise", "mxfp8"}) {
    EXPECT_EQ(recipe_name(parse_recipe(name)), name);
  }
  EXPECT_THROW(parse_recipe("fp4"), Error);
  PrecisionContext context;
  EXPECT_EQ(context.make(Recipe::Fp32, "fp32"), nullptr);
  EXPECT_TRUE(context.layers().empty());
  EXPECT_THROW(LinearPrecision(Recipe::Fp32), Error);
}

TEST(LinearPrecision, PreparedOperandsAreExactlyTheFormat) {
  // Ragged shapes: neither 32 nor 128 divides them.
  const int64_t rows = 70, cols = 300;
  const std::vector<float> x = random_values(rows * cols, 0.7f, 1);
  for (Recipe recipe : kQuantizing) {
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      for (GemmPass pass : {GemmPass::Forward, GemmPass::DataGrad, GemmPass::WeightGrad}) {
        if ((op == Operand::OutputGrad && pass == GemmPass::Forward) || (op == Operand::Input && pass == GemmPass::DataGrad) ||
            (op == Operand::Weight && pass == GemmPass::WeightGrad)) {
          continue;  // operands a pass does not read
        }
        LinearPrecision lp(recipe);
        const std::string what = recipe_name(recipe) + " operand " + std::to_string(static_cast<int>(op)) + " pass " +
                                 std::to_string(static_cast<int>(pass));
        const float* got = lp.prepare(op, pass, x.data(), rows, cols);
        const std::vector<float> want = expected_operand(recipe, op, pass, x, rows, cols);
        expect_bitwise(got, want, what);
        EXPECT_TRUE(any_difference(got, x)) << what << " left the operand unquantized";
      }
    }
  }
}

TEST(LinearPrecision, BlockScaledOperandsDependOnTheReductionDimension) {
  const int64_t rows = 64, cols = 96;
  std::vector<float> x = random_values(rows * cols, 1.0f, 2);
  for (int64_t i = 0; i < rows * cols; i += 37) x[i] *= 300.0f;  // outliers make the blocks differ
  for (Recipe recipe : {Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    LinearPrecision lp(recipe);
    const float* r = lp.prepare(Operand::Input, GemmPass::Forward, x.data(), rows, cols);
    const std::vector<float> rowwise(r, r + rows * cols);
    const float* columns = lp.prepare(Operand::Input, GemmPass::WeightGrad, x.data(), rows, cols);
    EXPECT_TRUE(any_difference(columns, rowwise)) << recipe_name(recipe);
  }
}

TEST(LinearPrecision, NonFiniteFp8OperandsPassThrough) {
  const int64_t rows = 4, cols = 64;
  std::vector<float> x = random_values(rows * cols, 1.0f, 3);
  x[5] = INFINITY;
  for (Recipe recipe : {Recipe::Fp8Delayed, Recipe::Fp8Current, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    LinearPrecision lp(recipe);
    const float* got = lp.prepare(Operand::OutputGrad, GemmPass::DataGrad, x.data(), rows, cols);
    EXPECT_TRUE(std::isinf(got[5])) << recipe_name(recipe) << ": a saturating cast would hide the overflow";
    if (recipe == Recipe::Fp8Delayed) {
      EXPECT_TRUE(std::isinf(lp.pending_amax(Operand::OutputGrad)));
    }
  }
  LinearPrecision fp16(Recipe::Fp16);
  x[5] = 70000.0f;  // past fp16's range
  EXPECT_TRUE(std::isinf(fp16.prepare(Operand::Input, GemmPass::Forward, x.data(), rows, cols)[5]));
}

// Forward, dgrad and wgrad against fp32 GEMMs (the same kernels) of independently quantized
// operands, bitwise: the forward's and dgrad's outputs rounded to the recipe's activation dtype (the
// forward's bias rounded to it before it is added),
// the weight gradient added unrounded into the fp32 main gradient (and so not a rounded value).
TEST(LinearPrecision, GemmsEqualFp32GemmsOfQuantizedOperands) {
  const int64_t n = 45, IC = 150, OC = 70;
  const std::vector<float> in = random_values(n * IC, 1.0f, 4);
  const std::vector<float> w = random_values(OC * IC, 0.05f, 5);
  const std::vector<float> bias = random_values(OC, 0.1f, 6);
  const std::vector<float> dout = random_values(n * OC, 0.01f, 7);
  const std::vector<float> residual = random_values(n * OC, 1.0f, 8);
  const std::vector<float> din0 = random_values(n * IC, 1.0f, 9);
  const std::vector<float> dw0 = random_values(OC * IC, 1.0f, 10);
  for (Recipe recipe : kQuantizing) {
    SCOPED_TRACE(recipe_name(recipe));
    auto round_out = [&](std::vector<float>& v) {
      if (recipe == Recipe::Fp16) {
        p::round_to_fp16(v.data(), static_cast<int64_t>(v.size()));
      } else {
        p::round_to_bf16(v.data(), static_cast<int64_t>(v.size()));
      }
    };
    LinearPrecision lp(recipe);
    // Forward with bias; and accumulating into a residual stream.
    std::vector<float> out(n * OC), acc = residual;
    lp.forward(out.data(), in.data(), w.data(), bias.data(), n, IC, OC);
    lp.forward(acc.data(), in.data(), w.data(), nullptr, n, IC, OC, true);
    const std::vector<float> qin = expected_operand(recipe, Operand::Input, GemmPass::Forward, in, n, IC);
    const std::vector<float> qw = expected_operand(recipe, Operand::Weight, GemmPass::Forward, w, OC, IC);
    // The bias is added rounded to the output's dtype (a 16-bit model's bias), then the sum is rounded.
    std::vector<float> rounded_bias = bias, want(n * OC), product(n * OC), want_acc = residual;
    round_out(rounded_bias);
    k::linear_forward(want.data(), qin.data(), qw.data(), rounded_bias.data(), n, IC, OC);
    round_out(want);
    std::vector<float> with_fp32_bias(n * OC);
    k::linear_forward(with_fp32_bias.data(), qin.data(), qw.data(), bias.data(), n, IC, OC);
    round_out(with_fp32_bias);
    EXPECT_TRUE(any_difference(want.data(), with_fp32_bias)) << "the bias's rounding shows in no output";
    k::linear_forward(product.data(), qin.data(), qw.data(), nullptr, n, IC, OC);
    round_out(product);
    for (size_t i = 0; i < want_acc.size(); ++i) want_acc[i] += product[i];
    expect_bitwise(out.data(), want, "forward");
    expect_bitwise(acc.data(), want_acc, "forward into a residual");
    std::vector<float> fp32(n * OC);
    k::linear_forward(fp32.data(), in.data(), w.data(), bias.data(), n, IC, OC);
    EXPECT_TRUE(any_difference(out.data(), fp32));

    // Backward: din and dW are added to what they held; dbias from the unquantized dout.
    std::vector<float> din = din0, dw = dw0, dbias(OC, 0.5f);
    lp.backward(din.data(), dw.data(), dbias.data(), dout.data(), in.data(), w.data(), n, IC, OC);
    const std::vector<float> g_d = expected_operand(recipe, Operand::OutputGrad, GemmPass::DataGrad, dout, n, OC);
    const std::vector<float> w_d = expected_operand(recipe, Operand::Weight, GemmPass::DataGrad, w, OC, IC);
    const std::vector<float> g_w = expected_operand(recipe, Operand::OutputGrad, GemmPass::WeightGrad, dout, n, OC);
    const std::vector<float> x_w = expected_operand(recipe, Operand::Input, GemmPass::WeightGrad, in, n, IC);
    std::vector<float> d_in(n * IC, 0.0f), d_w(OC * IC, 0.0f), want_bias(OC, 0.5f);
    k::linear_backward(d_in.data(), nullptr, nullptr, g_d.data(), nullptr, w_d.data(), n, IC, OC);
    k::linear_backward(nullptr, d_w.data(), nullptr, g_w.data(), x_w.data(), nullptr, n, IC, OC);
    k::linear_backward(nullptr, nullptr, want_bias.data(), dout.data(), nullptr, nullptr, n, IC, OC);
    round_out(d_in);
    std::vector<float> d_w_rounded = d_w;
    round_out(d_w_rounded);
    EXPECT_TRUE(any_difference(d_w.data(), d_w_rounded)) << "the weight gradient is not rounded";
    std::vector<float> want_din = din0, want_dw = dw0;
    for (size_t i = 0; i < want_din.size(); ++i) want_din[i] += d_in[i];
    for (size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += d_w[i];
    expect_bitwise(din.data(), want_din, "dgrad");
    expect_bitwise(dw.data(), want_dw, "wgrad");
    expect_bitwise(dbias.data(), want_bias, "dbias");
  }
}

TEST(LinearPrecision, DelayedScalingUsesThePreviousStepsAmaxes) {
  const int64_t rows = 16, cols = 40;
  const int margin = 1;
  std::vector<float> step1 = random_values(rows * cols, 1.0f, 11), step2 = random_values(rows * cols, 1.0f, 12);
  for (float& v : step2) v *= 8.0f;  // a different range than step 1's
  LinearPrecision lp(Recipe::Fp8Delayed, 4, margin);
  // Step 1: no history yet, scale 1.
  expect_bitwise(lp.prepare(Operand::Input, GemmPass::Forward, step1.data(), rows, cols),
                 expected_operand(Recipe::Fp8Delayed, Operand::Input, GemmPass::Forward, step1, rows, cols, 1.0f),
                 "step 1");
  const float amax1 = p::amax(step1.data(), rows * cols);
  EXPECT_EQ(lp.pending_amax(Operand::Input), amax1);
  const float amaxes[3] = {amax1, 0.0f, 0.0f};
  lp.commit_amaxes(amaxes);
  EXPECT_EQ(lp.pending_amax(Operand::Input), 0.0f);
  // Step 2 is quantized with step 1's amax, not its own.
  p::DelayedScaling reference(p::Fp8Format::E4M3, 4, margin);
  reference.update(amax1);
  EXPECT_EQ(lp.scale(Operand::Input), reference.scale());
  const float* got = lp.prepare(Operand::Input, GemmPass::Forward, step2.data(), rows, cols);
  expect_bitwise(got, expected_operand(Recipe::Fp8Delayed, Operand::Input, GemmPass::Forward, step2, rows, cols,
                                       reference.scale()),
                 "step 2");
  const float own = p::compute_scale(p::amax(step2.data(), rows * cols), 448.0f, margin, 1.0f);
  EXPECT_TRUE(any_difference(got, expected_operand(Recipe::Fp8Delayed, Operand::Input, GemmPass::Forward, step2, rows,
                                                   cols, own)));
  // The context carries the histories through a checkpoint.
  PrecisionContext context(PrecisionPolicy{Recipe::Fp8Delayed, 4, margin, false});
  auto a = context.make(Recipe::Fp8Delayed, "model.layers.0.mlp.up_proj");
  context.make(Recipe::Bf16, "lm_head");  // no delayed state
  a->prepare(Operand::OutputGrad, GemmPass::DataGrad, step2.data(), rows, cols);
  std::vector<float> pending = context.pending_amaxes();
  ASSERT_EQ(pending.size(), 3u);
  EXPECT_EQ(pending[2], p::amax(step2.data(), rows * cols));
  context.commit_amaxes(pending);
  PrecisionContext restored(PrecisionPolicy{Recipe::Fp8Delayed, 4, margin, false});
  auto b = restored.make(Recipe::Fp8Delayed, "model.layers.0.mlp.up_proj");
  restored.make(Recipe::Bf16, "lm_head");
  EXPECT_NE(b->scale(Operand::OutputGrad), a->scale(Operand::OutputGrad));
  restored.restore(nlohmann::json::parse(context.state().dump()));
  EXPECT_EQ(b->scale(Operand::OutputGrad), a->scale(Operand::OutputGrad));
  EXPECT_EQ(b->delayed_scaling(Operand::OutputGrad).state().amax_history,
            a->delayed_scaling(Operand::OutputGrad).state().amax_history);
  // State is keyed by GEMM name: a model missing from it is an error naming the GEMM; entries
  // of GEMMs this model does not hold (another pipeline stage's) are left alone.
  PrecisionContext other(PrecisionPolicy{Recipe::Fp8Delayed, 4, margin, false});
  other.make(Recipe::Fp8Delayed, "model.layers.1.mlp.up_proj");
  try {
    other.restore(context.state());
    ADD_FAILURE() << "restored a state without the layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.mlp.up_proj"), std::string::npos) << e.what();
  }
  PrecisionContext empty(PrecisionPolicy{Recipe::Fp8Delayed, 4, margin, false});
  EXPECT_NO_THROW(empty.restore(context.state()));
}

config::ModelConfig small_llama(int layers) {
  config::ModelConfig c;
  c.vocab_size = 31;
  c.d_model = 32;
  c.layers = layers;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn_size = 48;
  c.norm = config::Norm::Rms;
  c.activation = config::Activation::Swiglu;
  c.positions = config::Positions::Rope;
  c.tied_embeddings = true;
  c.max_seq_len = 16;
  c.init_std = 0.1;
  return c;
}

TEST(LinearPrecision, ModelBuildsTheRecipePerLayer) {
  {
    Transformer fp32(small_llama(3));
    EXPECT_TRUE(fp32.precision().layers().empty());
  }
  // 3 layers x (qkv, o, gate_up, down) + the head. FP8 with bf16 edge layers: only the middle
  // block's four linears are FP8; the head is bf16.
  Transformer fp8(small_llama(3), {}, PrecisionPolicy{Recipe::Fp8Current, 16, 0, true});
  const auto& layers = fp8.precision().layers();
  ASSERT_EQ(layers.size(), 13u);
  for (size_t i = 0; i < layers.size(); ++i) {
    const bool middle = i >= 4 && i < 8;
    EXPECT_EQ(layers[i]->recipe(), middle ? Recipe::Fp8Current : Recipe::Bf16) << "linear " << i;
  }
  Transformer all(small_llama(3), {}, PrecisionPolicy{Recipe::Mxfp8, 16, 0, false});
  for (size_t i = 0; i + 1 < all.precision().layers().size(); ++i) {
    EXPECT_EQ(all.precision().layers()[i]->recipe(), Recipe::Mxfp8);
  }
  EXPECT_EQ(all.precision().layers().back()->recipe(), Recipe::Bf16);
  Transformer half(small_llama(2), {}, PrecisionPolicy{Recipe::Fp16, 16, 0, true});
  for (const auto& l : half.precision().layers()) EXPECT_EQ(l->recipe(), Recipe::Fp16);
}

// The same parameters and batch: each recipe's loss is close to fp32's but not equal to it
// (the GEMMs really run in the format), and the fp32 model is untouched by the machinery.
// One forward and backward of a 3-layer Llama under `policy`: the same weights and batch each call.
double loss_of(const PrecisionPolicy& policy) {
  const int64_t batch = 2, seq = 12;
  std::vector<int32_t> inputs(batch * seq), targets(batch * seq);
  for (int64_t i = 0; i < batch * seq; ++i) {
    inputs[i] = static_cast<int32_t>((i * 7 + 3) % 31);
    targets[i] = static_cast<int32_t>((i * 5 + 1) % 31);
  }
  Transformer model(small_llama(3), {}, policy);
  model.initialize(5);
  return model.forward_backward(inputs.data(), targets.data(), batch, seq, 1.0f);
}

TEST(LinearPrecision, ModelLossesAreCloseToFp32) {
  const double fp32 = loss_of({});
  EXPECT_EQ(fp32, loss_of(PrecisionPolicy{Recipe::Fp32, 16, 0, true}));
  for (Recipe recipe : kQuantizing) {
    const double loss = loss_of(PrecisionPolicy{recipe, 16, 0, false});
    EXPECT_NE(loss, fp32) << recipe_name(recipe);
    EXPECT_NEAR(loss, fp32, 0.05 * fp32) << recipe_name(recipe);
  }
}

// precision.attention: auto gives attention bf16 operands under the bf16, FP8 and MX recipes and
// fp32 under fp32 and fp16; either can be asked for whatever the recipe. In the model, bf16
// attention alone moves the loss a little (the rounding really happens).
TEST(LinearPrecision, AttentionTakesBf16UnderTheBf16AndFp8RecipesUnlessSet) {
  using config::AttentionPrecision;
  using kernels::AttentionOperands;
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp8Delayed, Recipe::Fp8Current, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    EXPECT_EQ(PrecisionPolicy{recipe}.attention_operands(), AttentionOperands::Bf16) << recipe_name(recipe);
    EXPECT_EQ((PrecisionPolicy{recipe, 16, 0, true, AttentionPrecision::Fp32}.attention_operands()),
              AttentionOperands::Fp32);
  }
  for (Recipe recipe : {Recipe::Fp32, Recipe::Fp16}) {
    EXPECT_EQ(PrecisionPolicy{recipe}.attention_operands(), AttentionOperands::Fp32) << recipe_name(recipe);
    EXPECT_EQ((PrecisionPolicy{recipe, 16, 0, true, AttentionPrecision::Bf16}.attention_operands()),
              AttentionOperands::Bf16);
  }
  const double fp32 = loss_of({});
  const double bf16_attention = loss_of(PrecisionPolicy{Recipe::Fp32, 16, 0, true, AttentionPrecision::Bf16});
  EXPECT_NE(bf16_attention, fp32);
  EXPECT_NEAR(bf16_attention, fp32, 1e-2 * fp32);
}

}  // namespace
}  // namespace loom::model
