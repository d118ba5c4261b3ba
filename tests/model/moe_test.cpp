// Mixture of experts on one rank: finite-difference checks of the router (each score function),
// the experts, the latent projections, the shared expert and the balancing losses; the
// dispatcher's permutation and regrouping; capacity drops by policy.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "../gradient_check.h"
#include "loom/kernels/ops.h"
#include "loom/model/expert_mlp.h"
#include "loom/model/flops.h"
#include "loom/model/linear_precision.h"
#include "loom/model/moe_layer.h"
#include "loom/precision/formats.h"

namespace loom::model {
namespace {

config::ModelConfig moe_model(config::MoeRouter router) {
  config::ModelConfig c;
  c.d_model = 8;
  c.heads = 2;
  c.ffn_size = 6;
  c.init_std = 0.4;
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.router = router;
  return c;
}

// Objective: sum(y . dy) + aux + z (aux scale 1), checked against finite differences.
void check_moe(const config::ModelConfig& config, int64_t batch = 2, int64_t seq = 3) {
  ParameterStore store;
  TensorParallel tp;
  MoeLayer layer(store, tp, {}, 0, "model.layers.0.mlp", config, config.ffn_size, 0.4f, 0.3f);
  store.allocate();
  store.initialize(5);
  if (config.moe.expert_bias) {
    for (int e = 0; e < config.moe.experts; ++e) layer.expert_bias()[e] = 0.05f * static_cast<float>(e % 3);
  }
  const int64_t n = batch * seq * config.d_model;
  auto x = loom::testing::random_vector(n, 21), dy = loom::testing::random_vector(n, 22);
  std::vector<float> y(n);
  MoeLayer::Saved saved;
  Workspace work;
  ParallelScratch scratch;
  auto loss = [&] {
    std::fill(y.begin(), y.end(), 0.0f);
    layer.forward(saved, y.data(), x.data(), batch, seq, scratch);
    return loom::testing::weighted_sum(y.data(), dy.data(), n) + saved.routing.aux_loss + saved.routing.z_loss;
  };
  loss();
  if (config.moe.aux_loss_coeff > 0) {
    EXPECT_GT(saved.routing.aux_loss, 0.0);
  }
  store.zero_grads();
  std::vector<float> dx(n, 0.0f);
  layer.backward(dx.data(), dy.data(), x.data(), saved, work, batch, seq, scratch);
  std::vector<float> analytic(store.grads(), store.grads() + store.total());
  loom::testing::FdTolerance tol{.eps = 2e-3, .atol = 2e-3, .rtol = 2e-2, .max_checks = 24};
  loom::testing::expect_gradient_matches("d_input", x.data(), n, dx.data(), loss, tol);
  for (const Parameter& p : store.list()) {
    loom::testing::expect_gradient_matches(p.name, store.values() + p.offset, p.numel, analytic.data() + p.offset,
                                           loss, tol);
  }
}

TEST(MoeGradients, TopkSoftmaxRouterWithAuxAndZLoss) {
  auto c = moe_model(config::MoeRouter::TopkSoftmax);
  c.moe.aux_loss_coeff = 0.5;
  c.moe.z_loss_coeff = 0.1;
  check_moe(c);
}

TEST(MoeGradients, SoftmaxTopkRouterPerSequenceAuxLoss) {
  auto c = moe_model(config::MoeRouter::SoftmaxTopk);
  c.moe.aux_loss = config::MoeAuxLoss::Sequence;
  c.moe.aux_loss_coeff = 0.5;
  c.moe.topk_scaling = 1.5;
  check_moe(c);
}

TEST(MoeGradients, SigmoidRouterWithExpertBiasAndAuxLoss) {
  auto c = moe_model(config::MoeRouter::Sigmoid);
  c.moe.expert_bias = true;
  c.moe.aux_loss_coeff = 0.5;
  c.moe.topk_scaling = 2.0;
  check_moe(c);
}

TEST(MoeGradients, LatentProjectionsSharedExpertAndGelu) {
  auto c = moe_model(config::MoeRouter::TopkSoftmax);
  c.moe.latent_size = 4;
  c.moe.shared_ffn_size = 5;
  c.moe.ffn_size = 3;
  check_moe(c);
  c.activation = config::Activation::Gelu;
  check_moe(c);
}

// Qwen2-MoE's shared expert scaled per token by sigmoid(x . g), under both softmax routers.
TEST(MoeGradients, GatedSharedExpert) {
  auto c = moe_model(config::MoeRouter::SoftmaxTopk);
  c.moe.shared_ffn_size = 5;
  c.moe.shared_expert_gate = true;
  check_moe(c);
  c.moe.router = config::MoeRouter::TopkSoftmax;
  check_moe(c);
}

// The gate is a per-token factor in (0, 1): with g = 0 it halves the shared expert's output.
TEST(MoeSharedExpertGate, ZeroGateHalvesTheSharedExpert) {
  auto c = moe_model(config::MoeRouter::TopkSoftmax);
  c.moe.shared_ffn_size = 5;
  const int64_t rows = 6, n = rows * c.d_model;
  auto x = loom::testing::random_vector(n, 21);
  auto run = [&](bool gate) {
    c.moe.shared_expert_gate = gate;
    ParameterStore store;
    TensorParallel tp;
    MoeLayer layer(store, tp, {}, 0, "model.layers.0.mlp", c, c.ffn_size, 0.4f, 0.3f);
    store.allocate();
    store.initialize(5);
    for (const Parameter& p : store.list()) {
      const bool zero = p.name.find(".shared_expert_gate.") != std::string::npos ||
                        (p.name.find(".shared_expert.") == std::string::npos);
      if (zero) std::fill(store.values() + p.offset, store.values() + p.offset + p.numel, 0.0f);
    }
    MoeLayer::Saved saved;
    ParallelScratch scratch;
    std::vector<float> y(n, 0.0f);
    layer.forward(saved, y.data(), x.data(), 2, 3, scratch);
    return y;
  };
  const std::vector<float> plain = run(false), gated = run(true);
  double norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(gated[i], 0.5f * plain[i], 1e-6f) << i;
    norm += std::abs(plain[i]);
  }
  EXPECT_GT(norm, 0.0);
}

// Under a precision recipe the routed experts' GEMMs run in the recipe: each expert's two
// projections a linear of its own, so every row an expert returns is the recipe's product of that
// expert's rows (an FP8 one under the FP8 recipes: a per-expert LinearPrecision over those rows
// gives the same bits, and it differs from bf16's) and a bf16 value, as the fp32 layer's are not;
// the router stays fp32 (the same experts are chosen), and the layer stays near the fp32 one.
TEST(MoePrecision, RoutedExpertsRunInTheRecipe) {
  auto c = moe_model(config::MoeRouter::TopkSoftmax);
  c.d_model = 32;  // FP8's and MX's blocks whole
  c.ffn_size = 32;
  const int64_t batch = 2, seq = 5, n = batch * seq * c.d_model;
  const auto x = loom::testing::random_vector(n, 21);
  const int64_t hidden = 2 * c.ffn_size;  // SwiGLU's [gate; up]
  ParameterStore store;
  TensorParallel tp;
  MoeLayer layer(store, tp, {}, 0, "model.layers.0.mlp", c, c.ffn_size, 0.2f, 0.2f);
  store.allocate();
  store.initialize(5);
  auto run = [&](Recipe recipe, MoeLayer::Saved& saved) {
    PrecisionContext context(PrecisionPolicy{.recipe = recipe});
    layer.set_precision(context, recipe, "model.layers.0.mlp");
    if (recipe != Recipe::Fp32) {
      EXPECT_EQ(context.layers().size(), 8u);  // 4 experts x (up, down)
      for (const auto& l : context.layers()) EXPECT_EQ(l->recipe(), recipe);
    }
    ParallelScratch scratch;
    std::vector<float> y(n, 0.0f);
    layer.forward(saved, y.data(), x.data(), batch, seq, scratch);
    return y;
  };
  // Expert e's output for its rows as a dense MLP of linears in `recipe` computes it.
  auto reference = [&](Recipe recipe, const MoeLayer::Saved& saved) {
    std::vector<float> out(saved.returned.size());
    int64_t at = 0;
    for (int e = 0; e < c.moe.experts; ++e) {
      const int64_t rows = saved.plan.expert_rows[e];
      const std::string name = "model.layers.0.mlp.experts." + std::to_string(e);
      std::vector<float> h(rows * hidden), a(rows * c.ffn_size);
      LinearPrecision up(recipe), down(recipe);
      const float* up_weight = store.value(store.find(name + ".gate_proj.weight"));
      up.forward(h.data(), saved.dispatched.data() + at * c.d_model, up_weight, nullptr, rows, c.d_model, hidden);
      activation_forward(Device::cpu(), c.activation, a.data(), h.data(), rows, c.ffn_size);
      down.forward(out.data() + at * c.d_model, a.data(), store.value(store.find(name + ".down_proj.weight")), nullptr,
                   rows, c.ffn_size, c.d_model);
      at += rows;
    }
    return out;
  };
  auto is_bf16 = [](float v) { return v == precision::bf16_to_float(precision::float_to_bf16(v)); };
  MoeLayer::Saved fp32_saved;
  const std::vector<float> fp32 = run(Recipe::Fp32, fp32_saved);
  MoeLayer::Saved bf16_saved;
  run(Recipe::Bf16, bf16_saved);
  for (Recipe recipe :
       {Recipe::Bf16, Recipe::Fp8Current, Recipe::Fp8Delayed, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    SCOPED_TRACE(recipe_name(recipe));
    MoeLayer::Saved saved;
    const std::vector<float> y = run(recipe, saved);
    EXPECT_EQ(saved.routing.expert, fp32_saved.routing.expert);
    const int64_t returned = static_cast<int64_t>(saved.returned.size());
    const std::vector<float> expected = reference(recipe, saved);
    int64_t rounded = 0, fp32_rounded = 0, as_bf16 = 0;
    for (int64_t i = 0; i < returned; ++i) {
      ASSERT_EQ(saved.returned.data()[i], expected[i]) << i;
      rounded += is_bf16(saved.returned.data()[i]);
      fp32_rounded += is_bf16(fp32_saved.returned.data()[i]);
      as_bf16 += saved.returned.data()[i] == bf16_saved.returned.data()[i];
    }
    EXPECT_EQ(rounded, returned);
    EXPECT_LT(fp32_rounded, returned / 2);
    if (recipe != Recipe::Bf16) {
      EXPECT_LT(as_bf16, returned / 2);  // FP8 products, not bf16 ones
    }
    double error = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      error += (y[i] - fp32[i]) * (y[i] - fp32[i]);
      norm += fp32[i] * fp32[i];
    }
    EXPECT_LT(std::sqrt(error / norm), recipe == Recipe::Bf16 ? 1e-2 : 1e-1);  // measured 5e-3, 6-7e-2
  }
}

// The experts' padding gathers rows by index, a negative index giving a row of zeros (scaled or
// not), whatever the output held before.
TEST(MoeDispatch, ANegativeGatherIndexGivesAZeroRow) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  const std::vector<int32_t> index = {2, -1, 0, -1};
  const std::vector<float> scale = {2, 3, 4, 5};
  std::vector<float> out(8, NAN);
  kernels::gather_rows(Device::cpu(), out.data(), x.data(), index.data(), nullptr, 4, 2);
  EXPECT_EQ(out, (std::vector<float>{5, 6, 0, 0, 1, 2, 0, 0}));
  std::fill(out.begin(), out.end(), NAN);
  kernels::gather_rows(Device::cpu(), out.data(), x.data(), index.data(), scale.data(), 4, 2);
  EXPECT_EQ(out, (std::vector<float>{10, 12, 0, 0, 4, 8, 0, 0}));
}

// Under the FP8 recipes each expert's rows are padded with zero rows to the multiple a GPU's FP8
// product takes (16; 128 for fp8_blockwise), and the padding changes nothing: the experts' outputs
// and input gradients equal, bit for bit, linears of the recipe run over each expert's rows
// alone, and their weight gradients those linears' up to the sums' order.
TEST(MoePrecision, PaddedExpertRowsChangeNothing) {
  const int width = 32, ffn = 32, hidden = 2 * ffn;  // SwiGLU's [gate; up]
  const std::string prefix = "model.layers.0.mlp";
  ParameterStore store;
  TensorParallel tp;
  ExpertMlp experts(store, ShardSpec{}, prefix, 0, 3, width, ffn, config::Activation::Swiglu, 0.2f, 0.2f);
  store.allocate();
  store.initialize(3);
  const std::vector<int64_t> rows = {5, 0, 19};
  const int64_t total = 24;
  const auto x = loom::testing::random_vector(total * width, 31), dy = loom::testing::random_vector(total * width, 32);
  for (Recipe recipe : {Recipe::Fp8Current, Recipe::Fp8Delayed, Recipe::Fp8Blockwise}) {
    SCOPED_TRACE(recipe_name(recipe));
    PrecisionContext context(PrecisionPolicy{.recipe = recipe});
    experts.set_precision(context, recipe, prefix, 3);
    const std::vector<int64_t> padded =
        recipe == Recipe::Fp8Blockwise ? std::vector<int64_t>{128, 0, 128} : std::vector<int64_t>{16, 0, 32};
    EXPECT_EQ(experts.padded_rows(rows), padded);
    ExpertMlp::Saved saved;
    ExpertScratch scratch;
    Workspace work;
    std::vector<float> y(total * width), dx(total * width);
    experts.forward(saved, y.data(), x.data(), rows, scratch);
    store.zero_grads();
    experts.backward(dx.data(), dy.data(), x.data(), saved, work, rows, scratch);
    int64_t at = 0;
    for (int e = 0; e < 3; ++e) {
      const int64_t n = rows[e];
      if (n == 0) continue;
      const std::string name = prefix + ".experts." + std::to_string(e);
      const int up_id = store.find(name + ".gate_proj.weight"), down_id = store.find(name + ".down_proj.weight");
      LinearPrecision up(recipe), down(recipe);
      std::vector<float> h(n * hidden), a(n * ffn), out(n * width);
      up.forward(h.data(), x.data() + at * width, store.value(up_id), nullptr, n, width, hidden);
      activation_forward(Device::cpu(), config::Activation::Swiglu, a.data(), h.data(), n, ffn);
      down.forward(out.data(), a.data(), store.value(down_id), nullptr, n, ffn, width);
      std::vector<float> da(n * ffn, 0.0f), dh(n * hidden), din(n * width, 0.0f);
      std::vector<float> d_down(width * ffn, 0.0f), d_up(hidden * width, 0.0f);
      down.backward(da.data(), d_down.data(), nullptr, dy.data() + at * width, a.data(), store.value(down_id), n, ffn,
                    width);
      activation_backward(Device::cpu(), config::Activation::Swiglu, dh.data(), da.data(), h.data(), n, ffn);
      up.backward(din.data(), d_up.data(), nullptr, dh.data(), x.data() + at * width, store.value(up_id), n, width,
                  hidden);
      for (int64_t i = 0; i < n * width; ++i) {
        ASSERT_EQ(y[at * width + i], out[i]) << "expert " << e << " output " << i;
        ASSERT_EQ(dx[at * width + i], din[i]) << "expert " << e << " input gradient " << i;
      }
      for (auto [id, expected] : {std::pair{up_id, &d_up}, std::pair{down_id, &d_down}}) {
        float largest = 0.0f;
        for (float g : *expected) largest = std::max(largest, std::abs(g));
        ASSERT_GT(largest, 0.0f);
        for (size_t i = 0; i < expected->size(); ++i) {
          EXPECT_NEAR(store.grad(id)[i], (*expected)[i], 1e-6f * largest) << "expert " << e << " weight " << id;
        }
      }
      at += n;
    }
  }
}

// Nemotron-H's latent MoE: squared-ReLU routed and shared experts behind latent projections.
TEST(MoeGradients, LatentSquaredReluExperts) {
  auto c = moe_model(config::MoeRouter::Sigmoid);
  c.activation = config::Activation::Relu2;
  c.moe.latent_size = 4;
  c.moe.shared_ffn_size = 5;
  c.moe.ffn_size = 3;
  check_moe(c);
}

TEST(MoeGradients, CapacityDroppingByPosition) {
  auto c = moe_model(config::MoeRouter::TopkSoftmax);
  c.moe.capacity_factor = 0.5;
  c.moe.drop_policy = config::MoeDropPolicy::Position;
  check_moe(c);
}

TEST(MoeDispatch, CapacityDropsWhatThePolicyNames) {
  // Six tokens, top-1, two experts, capacity factor 1: ceil(1 * 6 / 2) = 3 per expert; every
  // token picks expert 0.
  const std::vector<int32_t> expert(6, 0);
  const std::vector<float> weight = {0.1f, 0.9f, 0.5f, 0.7f, 0.3f, 0.8f};
  EXPECT_EQ(expert_capacity(6, 1, 2, 1.0), 3);
  DispatchPlan probs = plan_dispatch(expert.data(), weight.data(), 6, 1, 2, 1.0, config::MoeDropPolicy::Probs);
  EXPECT_EQ(probs.kept, (std::vector<uint8_t>{0, 1, 0, 1, 0, 1}));
  EXPECT_EQ(probs.order, (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(probs.dropped, 3);
  DispatchPlan first = plan_dispatch(expert.data(), weight.data(), 6, 1, 2, 1.0, config::MoeDropPolicy::Position);
  EXPECT_EQ(first.kept, (std::vector<uint8_t>{1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(first.expert_rows, (std::vector<int64_t>{3, 0}));
  DispatchPlan dropless = plan_dispatch(expert.data(), weight.data(), 6, 1, 2, 0.0, config::MoeDropPolicy::Probs);
  EXPECT_EQ(dropless.dropped, 0);
  EXPECT_EQ(dropless.order.size(), 6u);
}

// A tensor-parallel rank's share of a group's plan: the group's decisions (capacity drops over
// all the tokens) restricted to its tokens, counted from the share's first. Shares of uneven
// sizes together hold every kept selection once, in the group's expert order.
TEST(MoeDispatch, SharesOfAPlanKeepTheGroupsDecisions) {
  const int64_t tokens = 11;
  const int k = 2, experts = 3;
  std::vector<int32_t> expert(tokens * k);
  std::vector<float> weight(tokens * k);
  for (int64_t s = 0; s < tokens * k; ++s) {
    expert[s] = static_cast<int32_t>((s * 7 + s / 5) % experts);
    weight[s] = 0.1f + 0.03f * static_cast<float>((s * 5) % 13);
  }
  const DispatchPlan group =
      plan_dispatch(expert.data(), weight.data(), tokens, k, experts, 1.0, config::MoeDropPolicy::Probs);
  ASSERT_GT(group.dropped, 0);
  std::vector<int64_t> rows_per_expert(experts, 0);
  std::vector<std::vector<int64_t>> selections(experts);
  int64_t dropped = 0;
  for (const auto& [first, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 4}, {8, 3}}) {
    const DispatchPlan share = share_of_plan(group, first, count);
    EXPECT_EQ(share.tokens, count);
    const auto kept_from = group.kept.begin() + first * k;
    EXPECT_EQ(share.kept, std::vector<uint8_t>(kept_from, kept_from + count * k));
    dropped += share.dropped;
    int64_t row = 0;
    for (int e = 0; e < experts; ++e) {
      rows_per_expert[e] += share.expert_rows[e];
      for (int64_t n = 0; n < share.expert_rows[e]; ++n, ++row) {
        const int64_t selection = first * k + share.order[row];
        EXPECT_EQ(expert[selection], e);
        selections[e].push_back(selection);
      }
    }
    EXPECT_EQ(row, static_cast<int64_t>(share.order.size()));
  }
  EXPECT_EQ(dropped, group.dropped);
  EXPECT_EQ(rows_per_expert, group.expert_rows);
  std::vector<int64_t> in_group_order;
  for (int e = 0; e < experts; ++e) {
    in_group_order.insert(in_group_order.end(), selections[e].begin(), selections[e].end());
  }
  EXPECT_EQ(in_group_order, group.order);  // shares in token order: the group's order by expert, then token
  EXPECT_THROW(share_of_plan(group, 8, 4), Error);
}

TEST(MoeDispatch, PermutationRoundTripsEveryTokenWithItsWeight) {
  const int64_t tokens = 37, width = 3;
  const int k = 3, experts = 8, peers = 4;
  std::vector<int32_t> expert(tokens * k);
  std::vector<float> weight(tokens * k);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int i = 0; i < k; ++i) {
      expert[t * k + i] = static_cast<int32_t>((t * 5 + i * 3) % experts);
      weight[t * k + i] = 0.25f + 0.5f * static_cast<float>(i) + 0.01f * static_cast<float>(t);
    }
  }
  DispatchPlan plan = plan_dispatch(expert.data(), weight.data(), tokens, k, experts, 0.0, {});
  std::vector<float> x(tokens * width);
  std::iota(x.begin(), x.end(), 1.0f);
  std::vector<float> rows(plan.order.size() * width);
  permute_rows(rows.data(), x.data(), plan, width);
  for (size_t r = 1; r < plan.order.size(); ++r) {  // grouped by expert
    EXPECT_LE(expert[plan.order[r - 1]], expert[plan.order[r]]);
  }
  // Regrouping received rows to expert-major and back is the identity (counts as one peer's).
  const std::vector<int64_t> counts = send_counts_by_expert(plan, peers);
  std::vector<int64_t> recv(peers * experts / peers);
  for (int p = 0; p < peers; ++p) {
    for (int j = 0; j < experts / peers; ++j) recv[p * (experts / peers) + j] = counts[(p * 7 + j) % experts];
  }
  ExchangePlan xp = make_exchange_plan(plan, peers, recv);
  std::vector<float> in(xp.received * width), mid(in.size()), back(in.size());
  std::iota(in.begin(), in.end(), 0.0f);
  regroup_rows(Device::cpu(), mid.data(), in.data(), xp, width, true);
  regroup_rows(Device::cpu(), back.data(), mid.data(), xp, width, false);
  EXPECT_EQ(back, in);
  std::vector<float> out(tokens * width, 0.0f);
  unpermute_rows(out.data(), rows.data(), plan, weight.data(), width);
  for (int64_t t = 0; t < tokens; ++t) {
    const float w = weight[t * k] + weight[t * k + 1] + weight[t * k + 2];
    for (int64_t c = 0; c < width; ++c) EXPECT_FLOAT_EQ(out[t * width + c], w * x[t * width + c]) << t;
  }
}

// The layer moves rows with kernels/ops.h's entries (the same code on every device): the gather by
// each dispatched row's token and the weighted scatter-add equal the host permutation and its
// inverse exactly, and the row dot products the double sums of the combine's weight gradient.
TEST(MoeDispatch, TheLayersRowEntriesEqualTheHostReferences) {
  const int64_t tokens = 29, width = 5;
  const int k = 2, experts = 4;
  std::vector<int32_t> expert(tokens * k);
  std::vector<float> weight(tokens * k), x(tokens * width), g(tokens * width);
  for (int64_t s = 0; s < tokens * k; ++s) {
    expert[s] = static_cast<int32_t>((s * 3 + s / 5) % experts);
    weight[s] = 0.1f + 0.037f * static_cast<float>(s % 11);
  }
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::sin(0.7f * static_cast<float>(i));
    g[i] = std::cos(0.3f * static_cast<float>(i));
  }
  const DispatchPlan plan = plan_dispatch(expert.data(), weight.data(), tokens, k, experts, 1.0, {});
  const int64_t R = static_cast<int64_t>(plan.order.size());
  const std::vector<int32_t> token = dispatched_tokens(plan);
  std::vector<float> row_weight(R);
  for (int64_t r = 0; r < R; ++r) row_weight[r] = weight[plan.order[r]];
  std::vector<float> rows(R * width), want_rows(R * width);
  kernels::gather_rows(Device::cpu(), rows.data(), x.data(), token.data(), nullptr, R, width);
  permute_rows(want_rows.data(), x.data(), plan, width);
  EXPECT_EQ(rows, want_rows);
  std::vector<float> out(tokens * width, 0.0f), want_out(out);
  kernels::scatter_add_rows(Device::cpu(), out.data(), rows.data(), width, token.data(), row_weight.data(), R, width);
  unpermute_rows(want_out.data(), rows.data(), plan, weight.data(), width);
  EXPECT_EQ(out, want_out);
  std::vector<double> dots(R);
  kernels::row_dots(Device::cpu(), dots.data(), g.data(), token.data(), rows.data(), width, R, width);
  for (int64_t r = 0; r < R; ++r) {
    double want = 0.0;
    for (int64_t c = 0; c < width; ++c) want += static_cast<double>(g[token[r] * width + c]) * rows[r * width + c];
    EXPECT_EQ(dots[r], want) << r;
  }
}

// FLOPs (MFU and the pipeline partitioner's cost) count active parameters only: top-2 of 8
// experts of half the dense ffn size cost what the dense MLP does, plus the router.
TEST(MoeFlops, CountActiveParametersOnly) {
  config::ModelConfig dense;
  dense.d_model = 64;
  dense.heads = 4;
  dense.ffn_size = 128;
  config::ModelConfig moe = dense;
  moe.moe.experts = 8;
  moe.moe.top_k = 2;
  moe.moe.ffn_size = 64;
  const LayerSpec dense_layer = resolve_layers(dense)[0], moe_layer = resolve_layers(moe)[0];
  ASSERT_TRUE(moe_layer.moe);
  const double router = 3.0 * 2.0 * 64 * 8;
  EXPECT_DOUBLE_EQ(layer_training_flops_per_token(moe, moe_layer, 16),
                   layer_training_flops_per_token(dense, dense_layer, 16) + router);
  moe.moe.latent_size = 32;  // experts at half the width, plus the two projections
  const double expert_mlp = 2.0 * 32 * 128 + 2.0 * 64 * 32;
  const double attention = layer_training_flops_per_token(dense, {true, 4, 0}, 16);
  EXPECT_DOUBLE_EQ(layer_training_flops_per_token(moe, moe_layer, 16),
                   attention + router + 3.0 * (2 * expert_mlp + 4.0 * 64 * 32));
}

}  // namespace
}  // namespace loom::model
