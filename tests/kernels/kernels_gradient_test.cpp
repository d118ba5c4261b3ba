// Every CPU kernel's backward against finite differences of its forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../gradient_check.h"
#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/activation.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/cross_entropy.h"
#include "loom/kernels/cpu/embedding.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cpu/norm.h"
#include "loom/kernels/cpu/rope.h"

namespace loom::kernels::cpu {
namespace {

using loom::testing::expect_gradient_matches;
using loom::testing::random_vector;
using loom::testing::weighted_sum;

TEST(KernelGradients, LinearWithBias) {
  const int64_t n = 7, in = 13, out = 5;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2, 0.3f), b = random_vector(out, 3);
  auto dy = random_vector(n * out, 4);
  std::vector<float> y(n * out);
  auto loss = [&] {
    linear_forward(y.data(), x.data(), w.data(), b.data(), n, in, out);
    return weighted_sum(y.data(), dy.data(), n * out);
  };
  std::vector<float> dx(n * in, 0.0f), dw(out * in, 0.0f), db(out, 0.0f);
  linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in, out);
  expect_gradient_matches("dx", x.data(), x.size(), dx.data(), loss);
  expect_gradient_matches("dw", w.data(), w.size(), dw.data(), loss);
  expect_gradient_matches("db", b.data(), b.size(), db.data(), loss);
}

// Without accumulate_din the input gradient is written whole (over NaN), equal to the one added
// onto zeros; the weight and bias gradients still add.
TEST(KernelGradients, LinearBackwardWritesTheInputGradientWhenAsked) {
  const int64_t n = 5, in = 7, out = 3;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2), dy = random_vector(n * out, 3);
  std::vector<float> dx_added(n * in, 0.0f), dx_written(n * in, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> dw_once(out * in, 0.0f), dw_twice(out * in, 0.0f);
  linear_backward(dx_added.data(), dw_once.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out);
  linear_backward(dx_written.data(), dw_twice.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out, false);
  linear_backward(nullptr, dw_twice.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out, false);
  for (int64_t i = 0; i < n * in; ++i) EXPECT_EQ(dx_written[i], dx_added[i]) << i;
  for (int64_t i = 0; i < out * in; ++i) EXPECT_NEAR(dw_twice[i], 2.0f * dw_once[i], 1e-5f) << i;
}

TEST(KernelGradients, LinearAccumulatesIntoOutputAndGradients) {
  const int64_t n = 3, in = 4, out = 2;
  auto x = random_vector(n * in, 1), w = random_vector(out * in, 2);
  std::vector<float> plain(n * out), acc(n * out, 1.5f);
  linear_forward(plain.data(), x.data(), w.data(), nullptr, n, in, out);
  linear_forward(acc.data(), x.data(), w.data(), nullptr, n, in, out, true);
  for (int64_t i = 0; i < n * out; ++i) EXPECT_NEAR(acc[i], plain[i] + 1.5f, 1e-5f);
}

TEST(KernelGradients, RmsNorm) {
  const int64_t rows = 6, dim = 17;
  auto x = random_vector(rows * dim, 5), w = random_vector(dim, 6), dy = random_vector(rows * dim, 7);
  std::vector<float> y(rows * dim), rstd(rows);
  auto loss = [&] {
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
    return weighted_sum(y.data(), dy.data(), rows * dim);
  };
  loss();
  std::vector<float> dx(rows * dim, 0.0f), dw(dim, 0.0f);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim);
  expect_gradient_matches("dx", x.data(), x.size(), dx.data(), loss);
  expect_gradient_matches("dw", w.data(), w.size(), dw.data(), loss);
}

TEST(KernelGradients, LayerNorm) {
  const int64_t rows = 5, dim = 19;
  auto x = random_vector(rows * dim, 8), w = random_vector(dim, 9), b = random_vector(dim, 10);
  auto dy = random_vector(rows * dim, 11);
  std::vector<float> y(rows * dim), mean(rows), rstd(rows);
  auto loss = [&] {
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
    return weighted_sum(y.data(), dy.data(), rows * dim);
  };
  loss();
  std::vector<float> dx(rows * dim, 0.0f), dw(dim, 0.0f), db(dim, 0.0f);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), rows,
                     dim);
  expect_gradient_matches("dx", x.data(), x.size(), dx.data(), loss);
  expect_gradient_matches("dw", w.data(), w.size(), dw.data(), loss);
  expect_gradient_matches("db", b.data(), b.size(), db.data(), loss);
}

TEST(KernelGradients, CausalGroupedQueryAttention) {
  AttentionShape s{2, 5, 4, 2, 3};
  auto qkv = random_vector(s.batch * s.seq * s.qkv_width(), 12);
  auto dy = random_vector(s.batch * s.seq * s.heads * s.head_dim, 13);
  std::vector<float> out(dy.size()), probs(s.batch * s.heads * s.seq * s.seq);
  auto loss = [&] {
    reference_attention_forward(out.data(), probs.data(), qkv.data(), s);
    return weighted_sum(out.data(), dy.data(), out.size());
  };
  loss();
  std::vector<float> dqkv(qkv.size(), 0.0f);
  reference_attention_backward(dqkv.data(), dy.data(), probs.data(), qkv.data(), s);
  expect_gradient_matches("dqkv", qkv.data(), qkv.size(), dqkv.data(), loss, {.max_checks = 400});
}

TEST(KernelGradients, AttentionIsCausal) {
  AttentionShape s{1, 6, 2, 1, 4};
  auto qkv = random_vector(s.seq * s.qkv_width(), 14);
  std::vector<float> out(s.seq * s.heads * s.head_dim), probs(s.heads * s.seq * s.seq);
  reference_attention_forward(out.data(), probs.data(), qkv.data(), s);
  std::vector<float> before = out;
  // Changing the last position's key and value must not change earlier outputs.
  for (int64_t c = s.heads * s.head_dim; c < s.qkv_width(); ++c) qkv[(s.seq - 1) * s.qkv_width() + c] += 1.0f;
  reference_attention_forward(out.data(), probs.data(), qkv.data(), s);
  for (int64_t i = 0; i < (s.seq - 1) * s.heads * s.head_dim; ++i) EXPECT_EQ(out[i], before[i]);
}

TEST(KernelGradients, DecodeWithCacheMatchesFullAttention) {
  AttentionShape s{1, 7, 4, 2, 4};
  const int64_t W = s.qkv_width(), kv = s.kv_heads * s.head_dim, q = s.heads * s.head_dim;
  auto qkv = random_vector(s.seq * W, 15);
  std::vector<float> full(s.seq * q), probs(s.heads * s.seq * s.seq);
  reference_attention_forward(full.data(), probs.data(), qkv.data(), s);
  std::vector<float> keys(s.seq * kv), values(s.seq * kv), step(q);
  for (int64_t t = 0; t < s.seq; ++t) {
    std::copy(qkv.begin() + t * W + q, qkv.begin() + t * W + q + kv, keys.begin() + t * kv);
    std::copy(qkv.begin() + t * W + q + kv, qkv.begin() + t * W + q + 2 * kv, values.begin() + t * kv);
    attention_decode(step.data(), qkv.data() + t * W, W, keys.data(), values.data(), t, 1, s.heads, s.kv_heads,
                     s.head_dim);
    for (int64_t i = 0; i < q; ++i) EXPECT_NEAR(step[i], full[t * q + i], 1e-5f);
  }
}

TEST(KernelGradients, Rope) {
  const int64_t batch = 2, seq = 5, heads = 3, hd = 6, width = heads * hd + 2;
  RopeTable table(16, hd, 10000.0);
  auto x = random_vector(batch * seq * width, 16), dy = random_vector(x.size(), 17);
  std::vector<float> y(x.size());
  auto loss = [&] {
    y = x;
    rope_forward(y.data(), batch * seq, width, 1, heads, seq, 0, table);
    return weighted_sum(y.data(), dy.data(), y.size());
  };
  loss();
  std::vector<float> dx = dy;
  rope_backward(dx.data(), batch * seq, width, 1, heads, seq, 0, table);
  expect_gradient_matches("dx", x.data(), x.size(), dx.data(), loss, {.max_checks = 200});
  // Position 0 is the identity; rotation preserves each pair's norm.
  EXPECT_EQ(y[1], x[1] * 1.0f + 0.0f * 0.0f);
}

TEST(KernelGradients, RopeWithPerTokenPositions) {
  const int64_t batch = 2, seq = 5, heads = 2, hd = 4, width = heads * hd;
  RopeTable table(16, hd, 10000.0);
  const auto x = random_vector(batch * seq * width, 25);
  // Positions 3 + t as a per-token array give bitwise what positions_start = 3 gives.
  std::vector<int32_t> positions(batch * seq);
  for (int64_t r = 0; r < batch * seq; ++r) positions[r] = static_cast<int32_t>(3 + r % seq);
  std::vector<float> a = x, b = x;
  rope_forward(a.data(), batch * seq, width, 0, heads, seq, 3, table);
  rope_forward(b.data(), batch * seq, width, 0, heads, seq, 0, table, positions.data());
  EXPECT_EQ(a, b);
  // Restarted positions (packed documents): each row rotated by its own position; backward inverts.
  positions = {0, 1, 0, 0, 1, 2, 3, 4, 0, 1};
  b = x;
  rope_forward(b.data(), batch * seq, width, 0, heads, seq, 0, table, positions.data());
  for (int64_t r = 0; r < batch * seq; ++r) {
    std::vector<float> row(x.begin() + r * width, x.begin() + (r + 1) * width);
    rope_forward(row.data(), 1, width, 0, heads, 1, positions[r], table);
    for (int64_t c = 0; c < width; ++c) EXPECT_EQ(b[r * width + c], row[c]);
  }
  rope_backward(b.data(), batch * seq, width, 0, heads, seq, 0, table, positions.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(b[i], x[i], 1e-5f);
}

// RoPE on a bf16 tensor (the q/k/v a GPU keeps in bf16): each rotated value is the fp32 rotation
// of the widened values, rounded; the columns outside the rotated heads keep their bits.
TEST(KernelGradients, RopeOnBf16IsTheFp32RotationRounded) {
  const int64_t rows = 10, seq = 5, heads = 2, hd = 4, stride = 3 * hd + 3, first_col = 2;
  RopeTable table(16, hd, 10000.0);
  std::vector<uint16_t> x16;
  for (float v : random_vector(rows * stride, 26)) x16.push_back(f32_to_bf16(v));
  std::vector<float> widened(x16.size());
  for (size_t i = 0; i < x16.size(); ++i) widened[i] = bf16_to_f32(x16[i]);
  const std::vector<int32_t> positions = {0, 1, 0, 0, 1, 2, 3, 4, 0, 1};
  for (const int32_t* at : {static_cast<const int32_t*>(nullptr), positions.data()}) {
    std::vector<uint16_t> got = x16;
    std::vector<float> want = widened;
    rope_forward_bf16(got.data(), rows, stride, first_col, heads, seq, 3, table, at);
    rope_forward(want.data(), rows, stride, first_col, heads, seq, 3, table, at);
    int64_t moved = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], f32_to_bf16(want[i])) << "element " << i;
      moved += got[i] != x16[i];
    }
    EXPECT_GT(moved, rows * heads * hd / 2);  // the rotation did rotate
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < stride; ++c) {
        if (c < first_col || c >= first_col + heads * hd) {
          ASSERT_EQ(got[r * stride + c], x16[r * stride + c]);
        }
      }
    }
  }
}

// The norms' bf16 forms (what a GPU hands a bf16 projection) store each value the fp32 forms
// compute, rounded, and the same statistics; the output's poison is overwritten everywhere.
TEST(KernelGradients, NormsOnBf16AreTheFp32NormsRounded) {
  const int64_t rows = 7, dim = 37;
  const auto x = random_vector(rows * dim, 27), w = random_vector(dim, 28), b = random_vector(dim, 29);
  std::vector<float> want(rows * dim), want_mean(rows), want_rstd(rows), mean(rows, -1.0f), rstd(rows, -1.0f);
  auto expect_rounded = [&](const std::vector<uint16_t>& got) {
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], f32_to_bf16(want[i])) << "element " << i;
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(rstd[r], want_rstd[r]) << "row " << r;
  };
  std::vector<uint16_t> got(rows * dim, 0x7fc1);
  rmsnorm_forward(want.data(), want_rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
  rmsnorm_forward_bf16(got.data(), rstd.data(), x.data(), w.data(), rows, dim, 1e-5f);
  expect_rounded(got);
  got.assign(rows * dim, 0x7fc1);
  layernorm_forward(want.data(), want_mean.data(), want_rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
  layernorm_forward_bf16(got.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
  expect_rounded(got);
  EXPECT_EQ(mean, want_mean);
}

// The norms' backwards with din_amax take the max |v| of din after their add (fp8_current's for
// the projection that casts din next): amax_into's over it, from 0 or above a larger value (which
// stays), NaN when the output gradient holds one; din and the parameter gradients unchanged.
TEST(KernelGradients, NormBackwardsTakeTheAmaxOfTheirInputGradient) {
  const int64_t rows = 7, dim = 37;
  const auto x = random_vector(rows * dim, 31), w = random_vector(dim, 32), b = random_vector(dim, 33);
  const auto dx0 = random_vector(rows * dim, 34);
  auto dy = random_vector(rows * dim, 35);
  std::vector<float> y(rows * dim), mean(rows), rstd(rows);
  layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, dim, 1e-5f);
  for (const bool layer : {false, true}) {
    auto run = [&](std::vector<float>& dx, std::vector<float>& dw, std::vector<float>& db, float* amax) {
      dx = dx0;
      dw.assign(dim, 0.0f);
      db.assign(dim, 0.0f);
      if (layer) {
        layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(),
                           rows, dim, nullptr, amax);
      } else {
        rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), rows, dim, nullptr, amax);
      }
    };
    std::vector<float> dx, dw, db, dx_with, dw_with, db_with;
    run(dx, dw, db, nullptr);
    float largest = 0.0f;
    for (float v : dx) largest = std::max(largest, std::fabs(v));
    for (const float start : {0.0f, 1e30f}) {
      float amax = start;
      run(dx_with, dw_with, db_with, &amax);
      EXPECT_EQ(dx_with, dx) << layer;
      EXPECT_EQ(dw_with, dw) << layer;
      EXPECT_EQ(db_with, db) << layer;
      EXPECT_EQ(amax, start == 0.0f ? largest : start) << layer;
      EXPECT_GT(amax, 0.0f) << layer;
    }
    const float kept = dy[5];
    dy[5] = std::numeric_limits<float>::quiet_NaN();
    float amax = 0.0f;
    run(dx_with, dw_with, db_with, &amax);
    EXPECT_TRUE(std::isnan(amax)) << layer;
    dy[5] = kept;
  }
}

// The activations over bf16 inputs: into fp32 the fp32 kernels' outputs exactly (an FP8 block's
// activation), into bf16 those rounded (the bf16 recipe's); the backward's bias gradient is the
// column sums of the fp32 input gradient, whichever form that takes.
TEST(KernelGradients, ActivationsOverBf16InputsAreTheFp32Kernels) {
  const int64_t rows = 5, width = 11;
  for (const MlpActivation a : {MlpActivation::Swiglu, MlpActivation::Gelu, MlpActivation::Relu2}) {
    const int64_t in_width = a == MlpActivation::Swiglu ? 2 * width : width;
    std::vector<uint16_t> in16;
    for (float v : random_vector(rows * in_width, 30)) in16.push_back(f32_to_bf16(v));
    std::vector<float> in(in16.size()), want(rows * width), got(rows * width, NAN);
    for (size_t i = 0; i < in16.size(); ++i) in[i] = bf16_to_f32(in16[i]);
    if (a == MlpActivation::Swiglu) swiglu_forward(want.data(), in.data(), rows, width);
    if (a == MlpActivation::Gelu) gelu_forward(want.data(), in.data(), rows * width);
    if (a == MlpActivation::Relu2) relu2_forward(want.data(), in.data(), rows * width);
    activation_forward_bf16(a, got.data(), nullptr, in16.data(), rows, width);
    EXPECT_EQ(got, want) << static_cast<int>(a);
    std::vector<uint16_t> got16(rows * width, 0x7fc1);
    activation_forward_bf16(a, nullptr, got16.data(), in16.data(), rows, width);
    for (size_t i = 0; i < got16.size(); ++i) ASSERT_EQ(got16[i], f32_to_bf16(want[i])) << static_cast<int>(a);

    std::vector<uint16_t> dout16;
    for (float v : random_vector(rows * width, 31)) dout16.push_back(f32_to_bf16(v));
    std::vector<float> dout(dout16.size()), want_din(rows * in_width), din(rows * in_width, NAN);
    for (size_t i = 0; i < dout16.size(); ++i) dout[i] = bf16_to_f32(dout16[i]);
    if (a == MlpActivation::Swiglu) swiglu_backward(want_din.data(), dout.data(), in.data(), rows, width);
    if (a == MlpActivation::Gelu) gelu_backward(want_din.data(), dout.data(), in.data(), rows * width);
    if (a == MlpActivation::Relu2) relu2_backward(want_din.data(), dout.data(), in.data(), rows * width);
    const std::vector<float> bias0 = random_vector(in_width, 32);
    std::vector<float> want_bias = bias0, bias = bias0, bias_16 = bias0;
    add_column_sums(want_bias.data(), want_din.data(), rows, in_width);
    activation_backward_bf16(a, din.data(), nullptr, bias.data(), dout16.data(), in16.data(), rows, width);
    EXPECT_EQ(din, want_din) << static_cast<int>(a);
    EXPECT_EQ(bias, want_bias) << static_cast<int>(a);
    std::vector<uint16_t> din16(rows * in_width, 0x7fc1);
    activation_backward_bf16(a, nullptr, din16.data(), bias_16.data(), dout16.data(), in16.data(), rows, width);
    for (size_t i = 0; i < din16.size(); ++i) ASSERT_EQ(din16[i], f32_to_bf16(want_din[i])) << static_cast<int>(a);
    EXPECT_EQ(bias_16, want_bias) << static_cast<int>(a);
  }
}

// With an amax, each activation also takes the max |v| of what it writes (fp32, or the rounded
// bf16 values) into it, as amax_into would over its output: a larger amax stays, NaN wins.
TEST(KernelGradients, ActivationsOverBf16InputsTakeTheAmaxOfWhatTheyWrite) {
  const int64_t rows = 6, width = 13;
  auto max_abs = [](const std::vector<float>& v) {
    float m = 0.0f;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
  };
  auto widened = [](const std::vector<uint16_t>& v) {
    std::vector<float> out;
    for (uint16_t x : v) out.push_back(bf16_to_f32(x));
    return out;
  };
  for (const MlpActivation a : {MlpActivation::Swiglu, MlpActivation::Gelu, MlpActivation::Relu2}) {
    const int64_t in_width = a == MlpActivation::Swiglu ? 2 * width : width;
    std::vector<uint16_t> in16, dout16;
    for (float v : random_vector(rows * in_width, 40)) in16.push_back(f32_to_bf16(3.0f * v));
    for (float v : random_vector(rows * width, 41)) dout16.push_back(f32_to_bf16(v));
    std::vector<float> out(rows * width), din(rows * in_width);
    std::vector<uint16_t> out16(rows * width), din16(rows * in_width);
    float amax = 0.0f;
    activation_forward_bf16(a, out.data(), nullptr, in16.data(), rows, width, &amax);
    EXPECT_GT(amax, 0.0f);
    EXPECT_EQ(amax, max_abs(out)) << static_cast<int>(a);
    amax = 0.0f;
    activation_forward_bf16(a, nullptr, out16.data(), in16.data(), rows, width, &amax);
    EXPECT_EQ(amax, max_abs(widened(out16))) << static_cast<int>(a);
    amax = 0.0f;
    activation_backward_bf16(a, din.data(), nullptr, nullptr, dout16.data(), in16.data(), rows, width, &amax);
    EXPECT_GT(amax, 0.0f);
    EXPECT_EQ(amax, max_abs(din)) << static_cast<int>(a);
    amax = 0.0f;
    activation_backward_bf16(a, nullptr, din16.data(), nullptr, dout16.data(), in16.data(), rows, width, &amax);
    EXPECT_EQ(amax, max_abs(widened(din16))) << static_cast<int>(a);
    amax = 1e30f;  // a larger amax taken before stays
    activation_forward_bf16(a, out.data(), nullptr, in16.data(), rows, width, &amax);
    EXPECT_EQ(amax, 1e30f) << static_cast<int>(a);
    // NaN in the output gradient where the input is positive (squared ReLU passes no gradient
    // elsewhere): NaN wins.
    int64_t k = 0;
    while (bf16_to_f32(in16[static_cast<size_t>(k)]) <= 0.0f) ++k;
    dout16[static_cast<size_t>(k)] = 0x7fc0;
    amax = 0.0f;
    activation_backward_bf16(a, din.data(), nullptr, nullptr, dout16.data(), in16.data(), rows, width, &amax);
    EXPECT_TRUE(std::isnan(amax)) << static_cast<int>(a);
  }
}

TEST(KernelGradients, SwiGlu) {
  const int64_t rows = 4, width = 9;
  auto gu = random_vector(rows * 2 * width, 18), dy = random_vector(rows * width, 19);
  std::vector<float> y(rows * width);
  auto loss = [&] {
    swiglu_forward(y.data(), gu.data(), rows, width);
    return weighted_sum(y.data(), dy.data(), y.size());
  };
  std::vector<float> dgu(gu.size(), 1e3f);  // poison: the backward writes every element
  swiglu_backward(dgu.data(), dy.data(), gu.data(), rows, width);
  expect_gradient_matches("dgate_up", gu.data(), gu.size(), dgu.data(), loss, {.max_checks = 100});
}

TEST(KernelGradients, Gelu) {
  const int64_t n = 50;
  auto x = random_vector(n, 20, 2.0f), dy = random_vector(n, 21);
  std::vector<float> y(n);
  auto loss = [&] {
    gelu_forward(y.data(), x.data(), n);
    return weighted_sum(y.data(), dy.data(), n);
  };
  std::vector<float> dx(n, 1e3f);  // poison: the backward writes every element
  gelu_backward(dx.data(), dy.data(), x.data(), n);
  expect_gradient_matches("dx", x.data(), n, dx.data(), loss);
}

TEST(KernelGradients, EmbeddingWithRepeatedIds) {
  const int64_t vocab = 6, dim = 5, rows = 8;
  std::vector<int32_t> ids = {1, 3, 1, 0, 5, 3, 3, 2};
  auto table = random_vector(vocab * dim, 22), dy = random_vector(rows * dim, 23);
  std::vector<float> y(rows * dim);
  auto loss = [&] {
    embedding_forward(y.data(), ids.data(), table.data(), rows, dim, false);
    return weighted_sum(y.data(), dy.data(), y.size());
  };
  std::vector<float> dtable(table.size(), 0.0f);
  embedding_backward(dtable.data(), dy.data(), ids.data(), rows, dim);
  expect_gradient_matches("dtable", table.data(), table.size(), dtable.data(), loss, {.max_checks = 100});
  for (int64_t c = 0; c < dim; ++c) EXPECT_EQ(dtable[4 * dim + c], 0.0f);  // id 4 never used
}

TEST(KernelGradients, SoftmaxCrossEntropyWithIgnoredRows) {
  const int64_t rows = 5, vocab = 11;
  std::vector<int32_t> targets = {3, kIgnoreIndex, 0, 10, 7};
  auto logits = random_vector(rows * vocab, 24, 2.0f);
  std::vector<float> losses(rows);
  auto loss = [&] {
    std::vector<float> copy = logits;
    return softmax_cross_entropy(copy.data(), losses.data(), targets.data(), rows, vocab, 0.0f);
  };
  std::vector<float> grad = logits;
  const double total = softmax_cross_entropy(grad.data(), losses.data(), targets.data(), rows, vocab, 1.0f);
  EXPECT_NEAR(total, loss(), 1e-9);
  EXPECT_EQ(losses[1], 0.0f);
  for (int64_t v = 0; v < vocab; ++v) EXPECT_EQ(grad[vocab + v], 0.0f);
  expect_gradient_matches("dlogits", logits.data(), logits.size(), grad.data(), loss, {.max_checks = 100});
  std::vector<int32_t> bad = {vocab, 0, 0, 0, 0};
  EXPECT_THROW(softmax_cross_entropy(grad.data(), losses.data(), bad.data(), rows, vocab, 1.0f), loom::Error);
}

}  // namespace
}  // namespace loom::kernels::cpu
