// cuDNN's fused flash attention (kernels/cuda/cudnn_attention.h) against the CPU's fp32 kernel on
// the same bf16-rounded inputs: causal rows, GQA (4/2, 32/8) and MHA, head_dim 64 and 128, one
// token to 1030, q/k/v as views of a fused qkv and as separate buffers; forward out within 1e-2
// and lse within 1e-4, gradients (added into non-zero ones) within 1e-2, outputs poisoned first
// (backward where cuDNN's serves it: not one token, and on cuDNN up to 9.15.0 only key lengths
// that are multiples of 128); its bf16 gradients written into a fused qkv gradient's views at their
// row stride are the packed ones, and nothing between the views is written.
// The dispatcher of the bf16 operands takes cuDNN for a served shape and loom's kernels for packed
// documents, a block of keys, head_dim 40 and LOOM_ATTENTION=loom. Skipped, saying why, without a
// GPU and, separately, without cuDNN. The always-running part: cuDNN's status and the refusal
// report a reason and never throw, GPU or not.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/attention_bf16.h"
#include "loom/kernels/cuda/cudnn_attention.h"
#include "loom/kernels/cuda/cudnn_library.h"
#include "loom/kernels/cuda/scratch.h"
#include "loom/kernels/ops.h"

namespace loom::kernels::cuda {
namespace {

using testing::bf16_rounded;
using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;
using testing::random_values;
using testing::relative_error;
using testing::to_bf16;
using testing::to_float;

struct CudnnCase {
  std::string name;
  int64_t batch, seq, heads, kv_heads, head_dim;
  bool fused;  // q, k, v column blocks of one qkv; else three separate regions
};

// q, k, v (and their gradients) in one array: a fused qkv's rows, or three regions one after
// another with rows of their own widths.
struct Layout {
  explicit Layout(const CudnnCase& c) {
    const int64_t tokens = c.batch * c.seq, qw = c.heads * c.head_dim, kw = c.kv_heads * c.head_dim;
    if (c.fused) {
      const int64_t w = qw + 2 * kw;
      s = {c.batch, c.seq, c.seq, c.heads, c.kv_heads, c.head_dim, w, w, w, qw};
      q_at = 0, k_at = qw, v_at = qw + kw, elements = tokens * w;
    } else {
      s = {c.batch, c.seq, c.seq, c.heads, c.kv_heads, c.head_dim, qw, kw, kw, qw};
      q_at = 0, k_at = tokens * qw, v_at = tokens * (qw + kw), elements = tokens * (qw + 2 * kw);
    }
    s.operands = AttentionOperands::Bf16;
  }
  FlashAttentionShape s{};
  int64_t q_at = 0, k_at = 0, v_at = 0, elements = 0;
};

// Skipped too where loom refuses the library's SDPA altogether (9.10.0 and 9.10.1: known bugs).
#define SKIP_WITHOUT_CUDNN()                                                                          \
  do {                                                                                                \
    if (!cudnn_status().available) GTEST_SKIP() << "no cuDNN: " << cudnn_status().reason;             \
    if (cudnn_status().version == 91000 || cudnn_status().version == 91001)                           \
      GTEST_SKIP() << "cuDNN " << cudnn_status().version << "'s SDPA is refused (known bugs)";        \
  } while (false)

class CudnnAttention : public testing::GpuTest<::testing::TestWithParam<CudnnCase>> {
 protected:
  void SetUp() override {
    testing::GpuTest<::testing::TestWithParam<CudnnCase>>::SetUp();
    if (IsSkipped()) return;
    SKIP_WITHOUT_CUDNN();
  }
};

TEST_P(CudnnAttention, ForwardAndBackwardMatchTheCpu) {
  const Layout l(GetParam());
  const FlashAttentionShape& s = l.s;
  ASSERT_EQ(cudnn_attention_refusal(s, {}), "");
  const std::vector<float> qkv = bf16_rounded(random_values(seed_, l.elements, 1.0f));
  const std::vector<float> dout = bf16_rounded(random_values(seed_ + 1, s.batch * s.q_len * s.out_stride, 1.0f));
  const std::vector<float> grad0 = random_values(seed_ + 2, l.elements, 0.5f);
  std::vector<float> out(dout.size()), lse(s.batch * s.heads * s.q_len);
  flash_attention_forward(Device::cpu(), out.data(), lse.data(), qkv.data() + l.q_at, qkv.data() + l.k_at,
                          qkv.data() + l.v_at, s, {});
  DeviceArray<__nv_bfloat16> d_qkv(allocator_, to_bf16(qkv)), d_dout(allocator_, to_bf16(dout)),
      d_out(allocator_, std::vector<__nv_bfloat16>(out.size(), __float2bfloat16(NAN)));
  DeviceFloats d_lse(allocator_, poison(lse.size())), d_grad(allocator_, grad0);
  {
    Scratch scratch;
    cudnn_attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr + l.q_at, d_qkv.ptr + l.k_at, d_qkv.ptr + l.v_at, s,
                            scratch, nullptr);
  }
  const std::vector<float> got_out = to_float(d_out.host()), got_lse = d_lse.host();
  EXPECT_LE(relative_error(got_out, out), 1e-2);
  EXPECT_LE(relative_error(got_lse, lse), 1e-4);
  // Shapes cuDNN's backward does not serve stay with loom's kernels; one token never reaches it.
  const std::string backward_refused = cudnn_backward_refusal(s);
  if (s.q_len == 1) {
    EXPECT_NE(backward_refused, "");
  }
  if (!backward_refused.empty()) {
    EXPECT_EQ(cudnn_attention_prepare(s, true), backward_refused);
    std::printf("backward not on cuDNN %ld: %s\n", cudnn_status().version, backward_refused.c_str());
    return;
  }
  std::vector<float> grad = grad0;
  flash_attention_backward(Device::cpu(), grad.data() + l.q_at, grad.data() + l.k_at, grad.data() + l.v_at, dout.data(),
                           got_out.data(), lse.data(), qkv.data() + l.q_at, qkv.data() + l.k_at, qkv.data() + l.v_at, s,
                           {});
  {
    Scratch scratch;
    cudnn_attention_backward(d_grad.ptr + l.q_at, d_grad.ptr + l.k_at, d_grad.ptr + l.v_at, d_dout.ptr, d_out.ptr,
                             d_lse.ptr, d_qkv.ptr + l.q_at, d_qkv.ptr + l.k_at, d_qkv.ptr + l.v_at, s, scratch,
                             nullptr);
  }
  const std::vector<float> got = d_grad.host();
  // Each gradient on its own, so a small one is not hidden by the others.
  const std::vector<std::pair<int64_t, int64_t>> parts =
      GetParam().fused
          ? std::vector<std::pair<int64_t, int64_t>>{{0, l.elements}}
          : std::vector<std::pair<int64_t, int64_t>>{{l.q_at, l.k_at}, {l.k_at, l.v_at}, {l.v_at, l.elements}};
  for (const auto& [from, to] : parts) {
    const std::vector<float> want(grad.begin() + from, grad.begin() + to), have(got.begin() + from, got.begin() + to);
    const std::vector<float> before(grad0.begin() + from, grad0.begin() + to);
    std::vector<float> want_delta(want.size()), have_delta(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_delta[i] = want[i] - before[i], have_delta[i] = have[i] - before[i];
    EXPECT_LE(relative_error(have_delta, want_delta), 1e-2) << "gradient elements [" << from << ", " << to << ")";
    EXPECT_LE(relative_error(have, want), 1e-2);
  }
}

// The bf16 backward writing its gradients straight into a fused q/k/v gradient's views at their row
// stride (cudnn_gradients_into_views: no packed copy moved into them afterwards) writes what it
// writes packed, within bf16's precision (cuDNN's dQ sums by atomics: two calls differ in the last
// bits), and nothing between the views. Fused layouts only (separate ones are packed already).
TEST_P(CudnnAttention, GradientsWrittenIntoViewsAreThePackedOnes) {
  const Layout l(GetParam());
  const FlashAttentionShape& s = l.s;
  if (!GetParam().fused) GTEST_SKIP() << "separate q, k, v: their gradients are packed already";
  const std::string backward_refused = cudnn_backward_refusal(s);
  if (!backward_refused.empty()) GTEST_SKIP() << "backward not on cuDNN: " << backward_refused;
  const CudnnGradientStrides views{s.q_stride, s.k_stride, s.v_stride};
  const std::string refused = cudnn_attention_prepare(s, true, views);
  if (!refused.empty()) GTEST_SKIP() << "cuDNN refuses the views' strides (the packed copy serves): " << refused;
  const int64_t q_rows = s.batch * s.q_len, k_rows = s.batch * s.k_len;
  const int64_t qw = s.heads * s.head_dim, kw = s.kv_heads * s.head_dim;
  const std::vector<float> qkv = bf16_rounded(random_values(seed_, l.elements, 1.0f));
  const std::vector<float> dout = bf16_rounded(random_values(seed_ + 1, q_rows * s.out_stride, 1.0f));
  DeviceArray<__nv_bfloat16> d_qkv(allocator_, to_bf16(qkv)), d_dout(allocator_, to_bf16(dout)),
      d_out(allocator_, std::vector<__nv_bfloat16>(dout.size()));
  DeviceFloats d_lse(allocator_, poison(s.batch * s.heads * s.q_len));
  const __nv_bfloat16 kPoison = __float2bfloat16_rn(-7.0f);
  DeviceArray<__nv_bfloat16> packed_q(allocator_, std::vector<__nv_bfloat16>(q_rows * qw, kPoison)),
      packed_k(allocator_, std::vector<__nv_bfloat16>(k_rows * kw, kPoison)),
      packed_v(allocator_, std::vector<__nv_bfloat16>(k_rows * kw, kPoison)),
      fused(allocator_, std::vector<__nv_bfloat16>(l.elements, kPoison));
  {
    Scratch scratch;
    cudnn_attention_forward(d_out.ptr, d_lse.ptr, d_qkv.ptr + l.q_at, d_qkv.ptr + l.k_at, d_qkv.ptr + l.v_at, s,
                            scratch, nullptr);
    cudnn_attention_backward_bf16(packed_q.ptr, packed_k.ptr, packed_v.ptr, d_dout.ptr, d_out.ptr, d_lse.ptr,
                                  d_qkv.ptr + l.q_at, d_qkv.ptr + l.k_at, d_qkv.ptr + l.v_at, s, scratch, nullptr);
    cudnn_attention_backward_bf16(fused.ptr + l.q_at, fused.ptr + l.k_at, fused.ptr + l.v_at, d_dout.ptr, d_out.ptr,
                                  d_lse.ptr, d_qkv.ptr + l.q_at, d_qkv.ptr + l.k_at, d_qkv.ptr + l.v_at, s, scratch,
                                  nullptr, views);
  }
  const std::vector<float> got = to_float(fused.host());
  int64_t written = 0;
  for (const auto& [name, packed, at, rows, width, stride] :
       {std::tuple{"dq", &packed_q, l.q_at, q_rows, qw, s.q_stride},
        std::tuple{"dk", &packed_k, l.k_at, k_rows, kw, s.k_stride},
        std::tuple{"dv", &packed_v, l.v_at, k_rows, kw, s.v_stride}}) {
    const std::vector<float> want = to_float(packed->host());
    std::vector<float> view(rows * width);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < width; ++c) view[r * width + c] = got[at + r * stride + c];
    EXPECT_LE(relative_error(view, want), 1e-2) << name;
    written += rows * width;
  }
  int64_t poisoned = 0;
  for (float v : got) poisoned += v == -7.0f;
  EXPECT_GE(poisoned, l.elements - written) << "written outside the views";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttention,
                         // Sequences of 128 and 256 too: cuDNN up to 9.15.0 serves the backward
                         // only there (the others then check the forward alone).
                         ::testing::Values(CudnnCase{"gqa4_2_d64_fused", 2, 128, 4, 2, 64, true},
                                           CudnnCase{"gqa4_2_d128_separate_long", 1, 1030, 4, 2, 128, false},
                                           CudnnCase{"gqa32_8_d64_fused", 1, 130, 32, 8, 64, true},
                                           CudnnCase{"gqa32_8_d128_separate", 2, 256, 32, 8, 128, false},
                                           CudnnCase{"mha_d64_fused_long", 2, 1030, 2, 2, 64, true},
                                           CudnnCase{"token1_d128_fused", 2, 1, 4, 2, 128, true},
                                           CudnnCase{"token1_d64_separate", 1, 1, 4, 2, 64, false}),
                         [](const ::testing::TestParamInfo<CudnnCase>& info) { return info.param.name; });

// The bf16 operands' dispatcher: cuDNN for a served shape, loom's kernels (with the reason) for
// what cuDNN does not serve and under LOOM_ATTENTION=loom; a bad LOOM_ATTENTION is an Error.
TEST(CudnnAttentionDispatch, PicksCudnnWhereItServesAndLoomElsewhere) {
  SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_CUDNN();
  ASSERT_EQ(std::getenv("LOOM_ATTENTION"), nullptr) << "the test sets LOOM_ATTENTION itself";
  const Layout served(CudnnCase{"served", 2, 130, 4, 2, 64, true});
  EXPECT_EQ(attention_fallback_reason(served.s, {}, false), "");
  EXPECT_EQ(attention_fallback_reason(served.s, {}, true), cudnn_backward_refusal(served.s));
  const Layout one_token(CudnnCase{"one_token", 2, 1, 4, 2, 64, true});
  EXPECT_NE(attention_fallback_reason(one_token.s, {}, true), "");
  const int32_t ids[1] = {0};  // never read: the refusal looks only at which arrays are given
  const AttentionVisibility documents{ids, ids, ids, ids};
  EXPECT_NE(attention_fallback_reason(served.s, documents, false), "");
  FlashAttentionShape key_block = served.s;
  key_block.k_len = 2 * key_block.q_len;
  EXPECT_NE(attention_fallback_reason(key_block, {}, false).find("k_len"), std::string::npos);
  const Layout d40(CudnnCase{"d40", 1, 37, 3, 3, 40, true});
  EXPECT_NE(attention_fallback_reason(d40.s, {}, true).find("head_dim 40"), std::string::npos);
  ::setenv("LOOM_ATTENTION", "loom", 1);
  EXPECT_EQ(attention_fallback_reason(served.s, {}, false), "LOOM_ATTENTION=loom");
  ::setenv("LOOM_ATTENTION", "cudnn", 1);
  EXPECT_EQ(attention_fallback_reason(served.s, {}, false), "");
  EXPECT_THROW(attention_fallback_reason(d40.s, {}, false), Error);
  ::setenv("LOOM_ATTENTION", "fast", 1);
  EXPECT_THROW(attention_fallback_reason(served.s, {}, false), Error);
  ::unsetenv("LOOM_ATTENTION");
}

// No GPU needed: the status says why when cuDNN is unavailable, a missing library is refused with
// dlopen's reason, and the refusal of a served shape is empty only where cuDNN loaded (and is not
// 9.10.0 or 9.10.1, whose SDPA loom refuses).
TEST(CudnnAttentionStatus, ReportsAReasonAndNeverThrows) {
  const CudnnStatus& status = cudnn_status();
  EXPECT_EQ(status.available, status.reason.empty()) << status.reason;
  const CudnnStatus missing = cudnn_probe("/nonexistent/libcudnn.so.9");
  EXPECT_FALSE(missing.available);
  EXPECT_FALSE(missing.reason.empty());
  const Layout served(CudnnCase{"served", 1, 64, 4, 2, 64, true});
  const std::string refusal = cudnn_attention_refusal(served.s, {});
  const bool known_bugs = status.version == 91000 || status.version == 91001;
  EXPECT_EQ(refusal.empty(), status.available && !known_bugs) << refusal;
  const Layout d40(CudnnCase{"d40", 1, 37, 3, 3, 40, true});
  EXPECT_FALSE(cudnn_attention_refusal(d40.s, {}).empty());
}

}  // namespace
}  // namespace loom::kernels::cuda
