// Attention with bf16 operands (AttentionOperands::Bf16) on the CPU: bit for bit the fp32 kernel
// run on bf16-rounded copies of q, k, v (and out, dout) with forward's output rounded, for views
// of one fused qkv and for a separate block of keys and values (ring attention's), gradients
// added into non-zero buffers, the inputs untouched; the entries taking the output and its
// gradient as bf16 tensors equal to them; and the regions the copies share.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "../gradient_check.h"
#include "loom/core/dtype_convert.h"
#include "loom/core/error.h"
#include "loom/kernels/attention_operands.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/ops.h"

namespace loom::kernels {
namespace {

using loom::testing::random_vector;

std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  return x;
}

void expect_bitwise_equal(const std::string& what, const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  EXPECT_EQ(differ, 0) << what << ": " << differ << " elements differ, the first at " << first << " ("
                       << (first >= 0 ? a[first] : 0.0f) << " vs " << (first >= 0 ? b[first] : 0.0f) << ")";
}

// Elements that differ at all; the bf16 form must not be the fp32 one unchanged.
int64_t count_different(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

// q, k, v of one problem: either views of one fused qkv, or q from the fused rows and k, v from a
// separate [k_len, 2 * kv_width] block, as ring attention passes them.
struct Operands {
  FlashAttentionShape s;
  std::vector<float> qkv, kv, dout;
  std::vector<int32_t> q_pos, k_pos;
  bool fused;
  const float* q() const { return qkv.data(); }
  const float* k() const { return fused ? qkv.data() + s.heads * s.head_dim : kv.data(); }
  const float* v() const {
    return fused ? qkv.data() + (s.heads + s.kv_heads) * s.head_dim : kv.data() + s.kv_heads * s.head_dim;
  }
  AttentionVisibility vis() const {
    if (q_pos.empty()) return {};
    return {q_pos.data(), k_pos.data(), nullptr, nullptr};
  }
};

Operands fused_problem() {
  Operands p;
  const int64_t batch = 2, seq = 70, heads = 4, kv_heads = 2, hd = 16, W = (heads + 2 * kv_heads) * hd;
  p.s = {batch, seq, seq, heads, kv_heads, hd, W, W, W, heads * hd, AttentionOperands::Bf16};
  p.qkv = random_vector(batch * seq * W, 11);
  p.dout = random_vector(batch * seq * heads * hd, 12);
  p.fused = true;
  return p;
}

// 24 queries at positions 40..63 against a block of 50 keys at positions 0..49.
Operands key_block_problem() {
  Operands p;
  const int64_t heads = 6, kv_heads = 3, hd = 8, W = (heads + 2 * kv_heads) * hd, kv2 = 2 * kv_heads * hd;
  p.s = {1, 24, 50, heads, kv_heads, hd, W, kv2, kv2, heads * hd, AttentionOperands::Bf16};
  p.qkv = random_vector(24 * W, 21);
  p.kv = random_vector(50 * kv2, 22);
  p.dout = random_vector(24 * heads * hd, 23);
  for (int32_t i = 0; i < 24; ++i) p.q_pos.push_back(40 + i);
  for (int32_t j = 0; j < 50; ++j) p.k_pos.push_back(j);
  p.fused = false;
  return p;
}

// The fp32 form of p on operands rounded to bf16 (the same strides).
Operands rounded_fp32(const Operands& p) {
  Operands r = p;
  r.s.operands = AttentionOperands::Fp32;
  r.qkv = rounded(p.qkv);
  r.kv = rounded(p.kv);
  r.dout = rounded(p.dout);
  return r;
}

struct Results {
  std::vector<float> out, lse, dqkv, dkv;
};

Results run(const Operands& p, const std::vector<float>* backward_out = nullptr) {
  const FlashAttentionShape& s = p.s;
  Results r;
  r.out.assign(s.batch * s.q_len * s.out_stride, 0.0f);
  r.lse.assign(s.batch * s.heads * s.q_len, 0.0f);
  flash_attention_forward(Device::cpu(), r.out.data(), r.lse.data(), p.q(), p.k(), p.v(), s, p.vis());
  // Gradients add into non-zero buffers.
  r.dqkv = random_vector(static_cast<int64_t>(p.qkv.size()), 31);
  r.dkv = random_vector(static_cast<int64_t>(p.kv.size()), 32);
  float* dq = r.dqkv.data();
  float* dk = p.fused ? dq + s.heads * s.head_dim : r.dkv.data();
  float* dv = p.fused ? dq + (s.heads + s.kv_heads) * s.head_dim : r.dkv.data() + s.kv_heads * s.head_dim;
  const std::vector<float>& out = backward_out ? *backward_out : r.out;
  flash_attention_backward(Device::cpu(), dq, dk, dv, p.dout.data(), out.data(), r.lse.data(), p.q(), p.k(), p.v(), s,
                           p.vis());
  return r;
}

void expect_the_fp32_kernel_on_rounded_operands(const Operands& p) {
  const std::vector<float> qkv = p.qkv, kv = p.kv, dout = p.dout;
  const Results bf16 = run(p);
  expect_bitwise_equal("inputs untouched: qkv", p.qkv, qkv);
  expect_bitwise_equal("inputs untouched: kv", p.kv, kv);
  expect_bitwise_equal("inputs untouched: dout", p.dout, dout);
  // Forward: the fp32 kernel on rounded q, k, v, its output rounded; backward takes that output.
  const Operands r = rounded_fp32(p);
  Results fp32 = run(r);
  fp32.out = rounded(fp32.out);
  const Results again = run(r, &fp32.out);
  expect_bitwise_equal("out", bf16.out, fp32.out);
  expect_bitwise_equal("lse", bf16.lse, fp32.lse);
  expect_bitwise_equal("dqkv", bf16.dqkv, again.dqkv);
  expect_bitwise_equal("dkv", bf16.dkv, again.dkv);
  // And it is not the fp32 attention of the unrounded values.
  Operands plain = p;
  plain.s.operands = AttentionOperands::Fp32;
  const Results unrounded = run(plain);
  EXPECT_GT(count_different(bf16.out, unrounded.out), static_cast<int64_t>(bf16.out.size() / 2));
  EXPECT_GT(count_different(bf16.dqkv, unrounded.dqkv), static_cast<int64_t>(bf16.dqkv.size() / 4));
}

TEST(AttentionBf16, FusedQkvIsTheFp32KernelOnRoundedOperands) { expect_the_fp32_kernel_on_rounded_operands(fused_problem()); }

TEST(AttentionBf16, SeparateKeyBlockIsTheFp32KernelOnRoundedOperands) {
  expect_the_fp32_kernel_on_rounded_operands(key_block_problem());
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> h;
  for (float v : x) h.push_back(f32_to_bf16(v));
  return h;
}

// The entries on bf16 tensors (Attention::bf16_tensors) given q, k, v, out and dout as bf16 (in
// the same layouts) compute what the fp32 entries compute given them in fp32: the forward's bf16
// output holds the fp32 entry's output (already rounded) and lse is the same; the backward adds
// the same dq, dk, dv.
void expect_the_bf16_tensor_entries_to_equal_the_fp32_ones(const Operands& p) {
  const FlashAttentionShape& s = p.s;
  const Results want = run(p);
  const std::vector<uint16_t> qkv16 = bf16_bits(p.qkv), kv16 = bf16_bits(p.kv), dout16 = bf16_bits(p.dout);
  const uint16_t* q16 = qkv16.data();
  const uint16_t* k16 = p.fused ? q16 + s.heads * s.head_dim : kv16.data();
  const uint16_t* v16 = p.fused ? q16 + (s.heads + s.kv_heads) * s.head_dim : kv16.data() + s.kv_heads * s.head_dim;
  const int64_t outs = s.batch * s.q_len * s.out_stride;
  std::vector<uint16_t> out16(static_cast<size_t>(outs), 0xFFFF);
  std::vector<float> lse(want.lse.size(), 0.0f);
  flash_attention_forward_bf16_tensors(Device::cpu(), out16.data(), lse.data(), q16, k16, v16, s, p.vis());
  std::vector<float> out(static_cast<size_t>(outs));
  for (int64_t i = 0; i < outs; ++i) out[i] = bf16_to_f32(out16[i]);
  expect_bitwise_equal("out", out, want.out);
  expect_bitwise_equal("lse", lse, want.lse);
  std::vector<float> dqkv = random_vector(static_cast<int64_t>(p.qkv.size()), 31);
  std::vector<float> dkv = random_vector(static_cast<int64_t>(p.kv.size()), 32);
  float* dq = dqkv.data();
  float* dk = p.fused ? dq + s.heads * s.head_dim : dkv.data();
  float* dv = p.fused ? dq + (s.heads + s.kv_heads) * s.head_dim : dkv.data() + s.kv_heads * s.head_dim;
  flash_attention_backward_bf16_tensors(Device::cpu(), dq, dk, dv, dout16.data(), out16.data(), lse.data(), q16, k16,
                                        v16, s, p.vis());
  expect_bitwise_equal("dqkv", dqkv, want.dqkv);
  expect_bitwise_equal("dkv", dkv, want.dkv);
  Operands fp32 = p;
  fp32.s.operands = AttentionOperands::Fp32;
  EXPECT_THROW(
      flash_attention_forward_bf16_tensors(Device::cpu(), out16.data(), lse.data(), q16, k16, v16, fp32.s, p.vis()),
      Error);
}

TEST(AttentionBf16, Bf16TensorEntriesEqualTheFp32Entries) {
  expect_the_bf16_tensor_entries_to_equal_the_fp32_ones(fused_problem());
  expect_the_bf16_tensor_entries_to_equal_the_fp32_ones(key_block_problem());
}

// The backward writing its gradients in bf16 (Attention::bf16_gradients) writes what the fp32 form
// adds into zeros, rounded, into each view and nothing beside it (the fused rows' other columns
// keep their poison); the bias sums are add_column_sums of each view's fp32 gradient. With a
// rotation (no bias sums then) q's and k's fp32 gradients are rotated back first (rope_backward).
// p's q, k, v and dout in bf16 (in the same layouts), and the bf16-tensor forward's output and lse.
struct Bf16Forward {
  std::vector<uint16_t> qkv16, kv16, dout16, out16;
  std::vector<float> lse;
  const uint16_t *q16, *k16, *v16;
  explicit Bf16Forward(const Operands& p)
      : qkv16(bf16_bits(p.qkv)),
        kv16(bf16_bits(p.kv)),
        dout16(bf16_bits(p.dout)),
        out16(static_cast<size_t>(p.s.batch * p.s.q_len * p.s.out_stride)),
        lse(static_cast<size_t>(p.s.batch * p.s.heads * p.s.q_len)) {
    const FlashAttentionShape& s = p.s;
    q16 = qkv16.data();
    k16 = p.fused ? q16 + s.heads * s.head_dim : kv16.data();
    v16 = p.fused ? q16 + (s.heads + s.kv_heads) * s.head_dim : kv16.data() + s.kv_heads * s.head_dim;
    flash_attention_forward_bf16_tensors(Device::cpu(), out16.data(), lse.data(), q16, k16, v16, s, p.vis());
  }
};

void expect_bf16_gradients_to_be_the_fp32_ones_rounded(const Operands& p, const RopeTable* rope = nullptr) {
  const FlashAttentionShape& s = p.s;
  const Bf16Forward f(p);
  // The fp32 gradients from zero, in the operands' layouts.
  std::vector<float> dqkv(p.qkv.size(), 0.0f), dkv(p.kv.size(), 0.0f);
  const int64_t k_at = s.heads * s.head_dim, v_at = (s.heads + s.kv_heads) * s.head_dim;
  float* dq = dqkv.data();
  float* dk = p.fused ? dq + k_at : dkv.data();
  float* dv = p.fused ? dq + v_at : dkv.data() + s.kv_heads * s.head_dim;
  flash_attention_backward_bf16_tensors(Device::cpu(), dq, dk, dv, f.dout16.data(), f.out16.data(), f.lse.data(), f.q16,
                                        f.k16, f.v16, s, p.vis());
  const QkvRotation rotation{rope, s.q_len, nullptr};
  if (rope != nullptr) {
    rope_backward(Device::cpu(), dq, s.batch * s.q_len, s.q_stride, 0, s.heads, s.q_len, 0, *rope);
    rope_backward(Device::cpu(), dk, s.batch * s.k_len, s.k_stride, 0, s.kv_heads, s.q_len, 0, *rope);
  }
  std::vector<uint16_t> g16(p.qkv.size(), 0x7fc1), gkv16(p.kv.size(), 0x7fc1);
  uint16_t* dq16 = g16.data();
  uint16_t* dk16 = p.fused ? dq16 + k_at : gkv16.data();
  uint16_t* dv16 = p.fused ? dq16 + v_at : gkv16.data() + s.kv_heads * s.head_dim;
  const int64_t q_width = s.heads * s.head_dim, kv_width = s.kv_heads * s.head_dim;
  std::vector<float> bias_q = random_vector(q_width, 41), bias_k = random_vector(kv_width, 42),
                     bias_v = random_vector(kv_width, 43);
  std::vector<float> want_q = bias_q, want_k = bias_k, want_v = bias_v;
  if (rope != nullptr) {
    // No bias sums of rotated gradients: refused; then without them (the bias vectors unchanged).
    EXPECT_THROW(flash_attention_backward_bf16_gradients(Device::cpu(), dq16, dk16, dv16, bias_q.data(), bias_k.data(),
                                                         bias_v.data(), f.dout16.data(), f.out16.data(), f.lse.data(),
                                                         f.q16, f.k16, f.v16, s, p.vis(), rotation),
                 Error);
    flash_attention_backward_bf16_gradients(Device::cpu(), dq16, dk16, dv16, nullptr, nullptr, nullptr, f.dout16.data(),
                                            f.out16.data(), f.lse.data(), f.q16, f.k16, f.v16, s, p.vis(), rotation);
    for (std::vector<float>* want : {&want_q, &want_k, &want_v}) std::fill(want->begin(), want->end(), 0.0f);
    for (std::vector<float>* got : {&bias_q, &bias_k, &bias_v}) std::fill(got->begin(), got->end(), 0.0f);
  } else {
    flash_attention_backward_bf16_gradients(Device::cpu(), dq16, dk16, dv16, bias_q.data(), bias_k.data(),
                                            bias_v.data(), f.dout16.data(), f.out16.data(), f.lse.data(), f.q16, f.k16,
                                            f.v16, s, p.vis());
  }
  // Each view: rounded values where it lies, poison elsewhere; its columns' sums.
  auto expect_view = [&](const char* name, const float* want, const uint16_t* got, int64_t rows, int64_t width,
                         int64_t stride, std::vector<float>& want_bias, const std::vector<float>& got_bias) {
    std::vector<float> packed;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < width; ++c) {
        ASSERT_EQ(got[r * stride + c], f32_to_bf16(want[r * stride + c])) << name << " row " << r << " col " << c;
        packed.push_back(want[r * stride + c]);
      }
    }
    if (rope == nullptr) cpu::add_column_sums(want_bias.data(), packed.data(), rows, width);
    expect_bitwise_equal(name, got_bias, want_bias);
  };
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  expect_view("dq", dq, dq16, q_rows, q_width, s.q_stride, want_q, bias_q);
  expect_view("dk", dk, dk16, k_rows, kv_width, s.k_stride, want_k, bias_k);
  expect_view("dv", dv, dv16, k_rows, kv_width, s.v_stride, want_v, bias_v);
  int64_t poisoned = 0;
  for (uint16_t h : g16) poisoned += h == 0x7fc1;
  for (uint16_t h : gkv16) poisoned += h == 0x7fc1;
  const int64_t written = q_rows * q_width + 2 * k_rows * kv_width;
  EXPECT_EQ(poisoned, static_cast<int64_t>(g16.size() + gkv16.size()) - written);
  // Without bias sums: the same bf16 gradients.
  std::vector<uint16_t> again(p.qkv.size(), 0x7fc1), again_kv(p.kv.size(), 0x7fc1);
  flash_attention_backward_bf16_gradients(Device::cpu(), again.data(), p.fused ? again.data() + k_at : again_kv.data(),
                                          p.fused ? again.data() + v_at : again_kv.data() + kv_width, nullptr, nullptr,
                                          nullptr, f.dout16.data(), f.out16.data(), f.lse.data(), f.q16, f.k16, f.v16,
                                          s, p.vis(), rotation);
  EXPECT_EQ(again, g16);
  EXPECT_EQ(again_kv, gkv16);
}

TEST(AttentionBf16, Bf16GradientsAreTheFp32GradientsRoundedWithTheirColumnSums) {
  expect_bf16_gradients_to_be_the_fp32_ones_rounded(fused_problem());
  expect_bf16_gradients_to_be_the_fp32_ones_rounded(key_block_problem());
}

TEST(AttentionBf16, Bf16GradientsUndoRopeBeforeTheyAreRounded) {
  const Operands p = fused_problem();
  const RopeTable rope(p.s.q_len, p.s.head_dim, 10000.0);
  expect_bf16_gradients_to_be_the_fp32_ones_rounded(p, &rope);
}

// The backward writing its gradients whole in fp32 (Attention::bf16_tensors without bf16 gradients:
// per-tensor FP8) writes, bit for bit, what the bf16-tensor backward adds into zeroed views (then
// rotated back with a rotation), into poisoned views, and nothing beside them.
void expect_fp32_gradients_to_be_the_added_ones(const Operands& p, const RopeTable* rope = nullptr) {
  const FlashAttentionShape& s = p.s;
  const Bf16Forward f(p);
  const int64_t k_at = s.heads * s.head_dim, v_at = (s.heads + s.kv_heads) * s.head_dim;
  const int64_t kv_width = s.kv_heads * s.head_dim;
  struct Gradients {
    std::vector<float> qkv, kv;
    float* q() { return qkv.data(); }
    float* k(bool fused, int64_t at) { return fused ? qkv.data() + at : kv.data(); }
    float* v(bool fused, int64_t at, int64_t kv_width) { return fused ? qkv.data() + at : kv.data() + kv_width; }
  };
  Gradients want{std::vector<float>(p.qkv.size(), 0.0f), std::vector<float>(p.kv.size(), 0.0f)};
  flash_attention_backward_bf16_tensors(Device::cpu(), want.q(), want.k(p.fused, k_at), want.v(p.fused, v_at, kv_width),
                                        f.dout16.data(), f.out16.data(), f.lse.data(), f.q16, f.k16, f.v16, s, p.vis());
  if (rope != nullptr) {
    rope_backward(Device::cpu(), want.q(), s.batch * s.q_len, s.q_stride, 0, s.heads, s.q_len, 0, *rope);
    rope_backward(Device::cpu(), want.k(p.fused, k_at), s.batch * s.k_len, s.k_stride, 0, s.kv_heads, s.q_len, 0,
                  *rope);
  }
  Gradients got{std::vector<float>(p.qkv.size(), std::nanf("")), std::vector<float>(p.kv.size(), std::nanf(""))};
  float amax = 0.0f;  // taken by the same call (fp8_current's for the projection's cast)
  flash_attention_backward_fp32_gradients(Device::cpu(), got.q(), got.k(p.fused, k_at), got.v(p.fused, v_at, kv_width),
                                          f.dout16.data(), f.out16.data(), f.lse.data(), f.q16, f.k16, f.v16, s,
                                          p.vis(), QkvRotation{rope, s.q_len, nullptr}, &amax);
  // Where no view lies the poison stays (the zeros of `want` there are not the entry's).
  const int64_t q_width = s.heads * s.head_dim, q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  auto in_view = [](int64_t i, const float* base, const float* view, int64_t rows, int64_t width, int64_t stride) {
    const int64_t at = i - (view - base);
    return at >= 0 && at / stride < rows && at % stride < width;
  };
  const float* base = want.q();
  for (int64_t i = 0; i < static_cast<int64_t>(want.qkv.size()); ++i) {
    const bool written = in_view(i, base, want.q(), q_rows, q_width, s.q_stride) ||
                         (p.fused && (in_view(i, base, want.k(true, k_at), k_rows, kv_width, s.k_stride) ||
                                      in_view(i, base, want.v(true, v_at, kv_width), k_rows, kv_width, s.v_stride)));
    if (!written) want.qkv[static_cast<size_t>(i)] = std::nanf("");
  }
  if (p.fused) std::fill(want.kv.begin(), want.kv.end(), std::nanf(""));
  auto bits = [](const std::vector<float>& x) {
    std::vector<uint32_t> b;
    for (float v : x) b.push_back(std::bit_cast<uint32_t>(v));
    return b;
  };
  EXPECT_EQ(bits(got.qkv), bits(want.qkv));
  EXPECT_EQ(bits(got.kv), bits(want.kv));
  // The amax: the largest |v| of the views (the poison outside them, NaN, would have won).
  float largest = 0.0f;
  for (const std::vector<float>* x : {&want.qkv, &want.kv}) {
    for (float v : *x) {
      if (!std::isnan(v)) largest = std::max(largest, std::fabs(v));
    }
  }
  EXPECT_EQ(amax, largest);
  EXPECT_GT(amax, 0.0f);
  // And not what a backward without the rotation writes.
  if (rope != nullptr) {
    Gradients plain{std::vector<float>(p.qkv.size(), 0.0f), std::vector<float>(p.kv.size(), 0.0f)};
    flash_attention_backward_fp32_gradients(Device::cpu(), plain.q(), plain.k(p.fused, k_at),
                                            plain.v(p.fused, v_at, kv_width), f.dout16.data(), f.out16.data(),
                                            f.lse.data(), f.q16, f.k16, f.v16, s, p.vis());
    EXPECT_GT(count_different(plain.qkv, got.qkv), static_cast<int64_t>(q_rows * q_width / 2));
  }
}

TEST(AttentionBf16, Fp32GradientsAreTheAddedOnesWrittenWholeWithRopeUndone) {
  expect_fp32_gradients_to_be_the_added_ones(fused_problem());
  expect_fp32_gradients_to_be_the_added_ones(key_block_problem());
  const RopeTable rope(fused_problem().s.q_len, fused_problem().s.head_dim, 10000.0);
  expect_fp32_gradients_to_be_the_added_ones(fused_problem(), &rope);
}

// A rotation whose table has another head size, or no way to place its rows, is refused by name
// before any kernel runs (the rotation walks heads by the table's size: columns would go unwritten).
TEST(AttentionBf16, GradientWritingBackwardsRefuseARotationThatDoesNotFit) {
  const Operands p = fused_problem();
  const FlashAttentionShape& s = p.s;
  const Bf16Forward f(p);
  std::vector<float> dqkv(p.qkv.size());
  const int64_t k_at = s.heads * s.head_dim, v_at = (s.heads + s.kv_heads) * s.head_dim;
  auto fp32_gradients = [&](const QkvRotation& rotation) {
    flash_attention_backward_fp32_gradients(Device::cpu(), dqkv.data(), dqkv.data() + k_at, dqkv.data() + v_at,
                                            f.dout16.data(), f.out16.data(), f.lse.data(), f.q16, f.k16, f.v16, s,
                                            p.vis(), rotation);
  };
  const RopeTable narrow(s.q_len, s.head_dim / 2, 10000.0);
  try {
    fp32_gradients(QkvRotation{&narrow, s.q_len, nullptr});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RoPE table's head size " + std::to_string(s.head_dim / 2)),
              std::string::npos) << e.what();
  }
  const RopeTable rope(s.q_len, s.head_dim, 10000.0);
  try {
    fp32_gradients(QkvRotation{&rope, 0, nullptr});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("positions or a positive sequence length"), std::string::npos) << e.what();
  }
}

TEST(AttentionOperandRegions, FusedViewsShareOneCopy) {
  const Operands p = fused_problem();
  const int64_t rows = p.s.batch * p.s.q_len, W = p.s.q_stride;
  std::vector<OperandView> views = attention_views(p.s, p.q(), p.k(), p.v());
  const OperandLayout one = share_regions(views);
  ASSERT_EQ(one.regions.size(), 1u);
  EXPECT_EQ(one.regions[0].base, p.q());
  EXPECT_EQ(one.regions[0].span, W);
  EXPECT_EQ(one.regions[0].elements(), rows * W);
  EXPECT_EQ(one.offset_of, (std::vector<int64_t>{0, p.s.heads * p.s.head_dim, (p.s.heads + p.s.kv_heads) * p.s.head_dim}));
  // Listed v first, the region still starts at q; the last row's copy ends where v ends.
  std::swap(views[0], views[2]);
  const OperandLayout reordered = share_regions(views);
  ASSERT_EQ(reordered.regions.size(), 1u);
  EXPECT_EQ(reordered.regions[0].base, p.q());
  EXPECT_EQ(reordered.offset_of[0], (p.s.heads + p.s.kv_heads) * p.s.head_dim);
  // Only q and k: the copy stops after k's columns.
  const OperandLayout two = share_regions({views[2], views[1]});
  ASSERT_EQ(two.regions.size(), 1u);
  EXPECT_EQ(two.regions[0].span, (p.s.heads + p.s.kv_heads) * p.s.head_dim);
  EXPECT_EQ(two.regions[0].elements(), (rows - 1) * W + two.regions[0].span);
}

TEST(AttentionOperandRegions, SeparateBuffersKeepTheirOwnCopies) {
  const Operands p = key_block_problem();
  const OperandLayout layout = share_regions(attention_views(p.s, p.q(), p.k(), p.v()));
  ASSERT_EQ(layout.regions.size(), 2u);
  EXPECT_EQ(layout.region_of, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(layout.regions[1].span, p.s.k_stride);
  // Two compact buffers back to back (out, then dout right after it) never merge.
  std::vector<float> both(2 * 24 * 48);
  const OperandLayout outputs = share_regions({{both.data(), 24, 48, 48}, {both.data() + 24 * 48, 24, 48, 48}});
  EXPECT_EQ(outputs.regions.size(), 2u);
  // Nor do views of one row each (a single token) that lie side by side.
  const OperandLayout rows1 = share_regions({{both.data(), 1, 48, 48}, {both.data() + 48, 1, 48, 48}});
  EXPECT_EQ(rows1.regions.size(), 2u);
}

}  // namespace
}  // namespace loom::kernels
