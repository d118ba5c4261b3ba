// cuBLASLt products against the CPU and against fp64: the fp32 entries (gemm in all four
// transposes, accumulating or not; the linear layer forward and backward with bias) within
// 1e-5 of the CPU's (a bias added on its own: bit for bit); bf16 operands with fp32 accumulation within 1e-2 of the fp64 product of the
// fp32 inputs; FP8 with per-tensor scales (E4M3 x E4M3, E4M3 x E5M2) and with 1 x 128 / 128 x 128
// block scales within 1e-3 of the fp64 product of the quantised operands (loom::precision's
// reference; per-tensor with and without fast accumulation); MXFP8 emulated on Hopper (decode
// to bf16, bf16 GEMM) within 1e-5 of that product.
// cuBLASLt's bias epilogue (bf16 and per-tensor FP8 into bf16) bit for bit on exactly summed operands;
// its GELU epilogues (forward, and the derivative with the bias gradient) within bf16's rounding.
// Plans whose algorithm was timed among cuBLASLt's candidates (LOOM_GEMM_AUTOTUNE) likewise.
// Fresh random inputs, outputs poisoned. Skipped, saying why, without a GPU; the argument checks
// (FP8 shape rules, flash attention's head_dim) run everywhere. The bias gradient's column sums
// (fp32, and bf16 for the GELU epilogue's bias) bit for bit the CPU's.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cpu/linear.h"
#include "loom/kernels/cuda/backend.h"
#include "loom/kernels/cuda/bias.h"
#include "loom/kernels/cuda/flash_attention.h"
#include "loom/kernels/cuda/gemm_autotune.h"
#include "loom/kernels/cuda/gemm_lt.h"
#include "loom/kernels/cuda/quantize.h"
#include "loom/kernels/ops.h"
#include "loom/kernels/precision_gemm.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"
#include "loom/precision/mx.h"

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

// c[m, n] = a[m, k] . b[n, k]^T in fp64.
std::vector<double> product_nt(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n,
                               int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) s += static_cast<double>(a[i * k + p]) * b[j * k + p];
      c[i * n + j] = s;
    }
  return c;
}

class CudaGemm : public testing::GpuTest<> {};

TEST_F(CudaGemm, Fp32GemmInEveryTransposeMatchesTheCpu) {
  const Device gpu = Device::cuda(0);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {37, 53, 71}, {512, 768, 256}}) {
    for (int t = 0; t < 8; ++t) {
      const bool ta = t & 1, tb = t & 2, accumulate = t & 4;
      const std::vector<float> a = random_values(seed_ + t, m * k, 1.0f), b = random_values(seed_ + 10 + t, n * k, 1.0f),
                               c0 = random_values(seed_ + 20 + t, m * n, 1.0f);
      std::vector<float> c = c0;
      kernels::gemm(Device::cpu(), c.data(), a.data(), b.data(), m, n, k, ta, tb, accumulate);
      DeviceFloats d_a(allocator_, a), d_b(allocator_, b), d_c(allocator_, accumulate ? c0 : poison(m * n));
      kernels::gemm(gpu, d_c.ptr, d_a.ptr, d_b.ptr, m, n, k, ta, tb, accumulate);
      EXPECT_LE(relative_error(d_c.host(), c), 1e-5) << m << " " << n << " " << k << " ta " << ta << " tb " << tb
                                                     << " accumulate " << accumulate;
    }
  }
}

TEST_F(CudaGemm, LinearForwardAndBackwardMatchTheCpu) {
  const Device cpu = Device::cpu(), gpu = Device::cuda(0);
  const int64_t n = 300, in_f = 257, out_f = 130;
  const std::vector<float> x = random_values(seed_, n * in_f, 1.0f), w = random_values(seed_ + 1, out_f * in_f, 0.1f),
                           b = random_values(seed_ + 2, out_f, 1.0f), dy = random_values(seed_ + 3, n * out_f, 1.0f),
                           out0 = random_values(seed_ + 4, n * out_f, 1.0f), dx0 = random_values(seed_ + 5, n * in_f, 1.0f),
                           dw0 = random_values(seed_ + 6, out_f * in_f, 1.0f), db0 = random_values(seed_ + 7, out_f, 1.0f);
  for (bool accumulate : {false, true}) {
    std::vector<float> out = out0;
    kernels::linear_forward(cpu, out.data(), x.data(), w.data(), b.data(), n, in_f, out_f, accumulate);
    DeviceFloats d_x(allocator_, x), d_w(allocator_, w), d_b(allocator_, b), d_out(allocator_, accumulate ? out0 : poison(n * out_f));
    kernels::linear_forward(gpu, d_out.ptr, d_x.ptr, d_w.ptr, d_b.ptr, n, in_f, out_f, accumulate);
    EXPECT_LE(relative_error(d_out.host(), out), 1e-5) << "accumulate " << accumulate;
  }
  std::vector<float> dx = dx0, dw = dw0, db = db0;
  kernels::linear_backward(cpu, dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), n, in_f, out_f);
  DeviceFloats d_x(allocator_, x), d_w(allocator_, w), d_dy(allocator_, dy), d_dx(allocator_, dx0),
      d_dw(allocator_, dw0), d_db(allocator_, db0);
  kernels::linear_backward(gpu, d_dx.ptr, d_dw.ptr, d_db.ptr, d_dy.ptr, d_x.ptr, d_w.ptr, n, in_f, out_f);
  EXPECT_LE(relative_error(d_dx.host(), dx), 1e-5);
  EXPECT_LE(relative_error(d_dw.host(), dw), 1e-5);
  EXPECT_EQ(d_db.host(), db);  // column sums in the CPU's order
}

// The bias gradient alone: column sums in kernels/column_sums.h's order, bit for bit the CPU's, on
// row counts below, at and across a chunk's 64 rows, and past 65536 rows (chunks of 128).
TEST_F(CudaGemm, BiasGradientColumnSumsEqualTheCpuBitForBit) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {63, 5}, {64, 300}, {65, 257}, {16384, 768},
                            {65536 + 77, 33}, {1000, 3072}}) {
    const std::vector<float> dy = random_values(seed_, rows * cols, 1.0f), db0 = random_values(seed_ + 1, cols, 1.0f);
    std::vector<float> db = db0;
    kernels::linear_backward(Device::cpu(), nullptr, nullptr, db.data(), dy.data(), nullptr, nullptr, rows, 1, cols);
    DeviceFloats d_dy(allocator_, dy), d_db(allocator_, db0);
    kernels::linear_backward(Device::cuda(0), nullptr, nullptr, d_db.ptr, d_dy.ptr, nullptr, nullptr, rows, 1, cols);
    EXPECT_EQ(d_db.host(), db) << rows << " x " << cols;
    // Over bf16 values (add_column_sums_bf16: the GELU epilogue's bias gradient), two columns per
    // thread where the columns are even, one where odd: the CPU's sums of the widened values.
    const std::vector<float> dy16 = bf16_rounded(dy);
    std::vector<float> db16 = db0;
    ::loom::kernels::cpu::add_column_sums(db16.data(), dy16.data(), rows, cols);
    DeviceArray<__nv_bfloat16> d_dy16(allocator_, to_bf16(dy16));
    DeviceFloats d_db16(allocator_, db0);
    add_column_sums_bf16(d_db16.ptr, d_dy16.ptr, rows, cols);
    EXPECT_EQ(d_db16.host(), db16) << rows << " x " << cols << " in bf16";
  }
}

// A row-parallel linear's bias, added to the sum of the ranks' partial products: one add per
// element, bit for bit the CPU.
TEST_F(CudaGemm, AddBiasMatchesTheCpu) {
  for (auto [rows, width] : {std::pair<int64_t, int64_t>{1, 1}, {37, 129}, {1000, 768}}) {
    const std::vector<float> x0 = random_values(seed_, rows * width, 1.0f), b = random_values(seed_ + 1, width, 1.0f);
    std::vector<float> x = x0;
    kernels::add_bias(Device::cpu(), x.data(), b.data(), rows, width);
    DeviceFloats d_x(allocator_, x0), d_b(allocator_, b);
    kernels::add_bias(Device::cuda(0), d_x.ptr, d_b.ptr, rows, width);
    EXPECT_EQ(d_x.host(), x) << rows << " x " << width;
  }
}

TEST_F(CudaGemm, Bf16WithFp32AccumulationIsWithin1e2OfFp64) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{16, 16, 16}, {333, 250, 130}, {1024, 1024, 1024}}) {
    const std::vector<float> a = random_values(seed_, m * k, 1.0f), b = random_values(seed_ + 1, n * k, 1.0f);
    std::vector<__nv_bfloat16> ab(a.size()), bb(b.size());
    for (size_t i = 0; i < a.size(); ++i) ab[i] = __float2bfloat16(a[i]);
    for (size_t i = 0; i < b.size(); ++i) bb[i] = __float2bfloat16(b[i]);
    DeviceArray<__nv_bfloat16> d_a(allocator_, ab), d_b(allocator_, bb);
    DeviceFloats d_c(allocator_, poison(m * n));
    matmul(GemmOutput{d_c.ptr, GemmType::F32}, GemmOperand{d_a.ptr, GemmType::BF16, false},
           GemmOperand{d_b.ptr, GemmType::BF16, true}, m, n, k, 1.0f, 0.0f);
    EXPECT_LE(relative_error(d_c.host(), product_nt(a, b, m, n, k)), 1e-2) << m << " " << n << " " << k;
    DeviceArray<__nv_bfloat16> d_c16(allocator_, std::vector<__nv_bfloat16>(m * n, __float2bfloat16(NAN)));
    matmul(GemmOutput{d_c16.ptr, GemmType::BF16}, GemmOperand{d_a.ptr, GemmType::BF16, false},
           GemmOperand{d_b.ptr, GemmType::BF16, true}, m, n, k, 1.0f, 0.0f);
    const std::vector<__nv_bfloat16> c16 = d_c16.host();
    std::vector<float> c(c16.size());
    for (size_t i = 0; i < c.size(); ++i) c[i] = __bfloat162float(c16[i]);
    EXPECT_LE(relative_error(c, product_nt(a, b, m, n, k)), 1e-2) << "bf16 output " << m << " " << n << " " << k;
  }
}

// cuBLASLt's bias epilogue into a bf16 output, for bf16 and per-tensor E4M3 operands: bit for bit
// round(a . b + bias16) as the recipes define it (PrecisionGemm::bias), the bias a bf16 vector. The
// operands are small integers, so every product and sum is exact in fp32 in any order, and the
// bias's large fractional values make rounded and unrounded biases give different outputs: the
// expected values are computed with the bf16 bias, and checked to differ from the fp32 bias's.
TEST_F(CudaGemm, BiasEpilogueAddsTheBf16BiasBeforeOneRounding) {
  const int64_t m = 64, n = 48, k = 32;
  std::vector<float> a(m * k), b(n * k), bias(n);
  uint64_t state = static_cast<uint64_t>(seed_) * 2654435761u + 1;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((state >> 33) % 7) - 3;  // -3 .. 3: exact in bf16 and E4M3
  };
  for (float& v : a) v = static_cast<float>(next());
  for (float& v : b) v = static_cast<float>(next());
  for (int64_t j = 0; j < n; ++j) bias[j] = 300.0f + 7.37f * static_cast<float>(j) + 0.013f * static_cast<float>(j % 5);
  std::vector<float> bias_rounded = bias;
  precision::round_to_bf16(bias_rounded.data(), n);
  const std::vector<double> acc = product_nt(a, b, m, n, k);
  std::vector<float> want(m * n), with_fp32_bias(m * n);
  for (int64_t i = 0; i < m * n; ++i) {
    want[i] = static_cast<float>(acc[i]) + bias_rounded[i % n];
    with_fp32_bias[i] = static_cast<float>(acc[i]) + bias[i % n];
  }
  precision::round_to_bf16(want.data(), m * n);
  precision::round_to_bf16(with_fp32_bias.data(), m * n);
  ASSERT_NE(want, with_fp32_bias) << "the bias's rounding would show in no output";
  std::vector<__nv_bfloat16> a16(a.size()), b16(b.size()), bias16(n);
  for (size_t i = 0; i < a.size(); ++i) a16[i] = __float2bfloat16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = __float2bfloat16(b[i]);
  for (int64_t j = 0; j < n; ++j) bias16[j] = __float2bfloat16(bias[j]);
  std::vector<uint8_t> a8(a.size()), b8(b.size());
  for (size_t i = 0; i < a.size(); ++i) a8[i] = precision::float_to_fp8(a[i], precision::Fp8Format::E4M3);
  for (size_t i = 0; i < b.size(); ++i) b8[i] = precision::float_to_fp8(b[i], precision::Fp8Format::E4M3);
  DeviceArray<__nv_bfloat16> d_a16(allocator_, a16), d_b16(allocator_, b16), d_bias(allocator_, bias16);
  DeviceArray<uint8_t> d_a8(allocator_, a8), d_b8(allocator_, b8);
  DeviceFloats d_one(allocator_, std::vector<float>{1.0f});
  const GemmOperand bf16_operands[2] = {{d_a16.ptr, GemmType::BF16, false}, {d_b16.ptr, GemmType::BF16, true}};
  const GemmOperand fp8_operands[2] = {{d_a8.ptr, GemmType::E4M3, false, d_one.ptr, ScaleMode::Tensor},
                                       {d_b8.ptr, GemmType::E4M3, true, d_one.ptr, ScaleMode::Tensor}};
  for (const GemmOperand* operands : {bf16_operands, fp8_operands}) {
    DeviceArray<__nv_bfloat16> d_c(allocator_, std::vector<__nv_bfloat16>(m * n, __float2bfloat16(NAN)));
    matmul(GemmOutput{d_c.ptr, GemmType::BF16, d_bias.ptr}, operands[0], operands[1], m, n, k, 1.0f, 0.0f);
    const std::vector<__nv_bfloat16> c16 = d_c.host();
    std::vector<float> c(c16.size());
    for (size_t i = 0; i < c.size(); ++i) c[i] = __bfloat162float(c16[i]);
    EXPECT_EQ(c, want) << (operands == bf16_operands ? "bf16" : "e4m3") << " operands";
  }
  // Refused, naming the rule: a bias into an fp32 output.
  DeviceFloats d_c32(allocator_, poison(m * n));
  EXPECT_THROW(matmul(GemmOutput{d_c32.ptr, GemmType::F32, d_bias.ptr}, bf16_operands[0], bf16_operands[1], m, n, k,
                      1.0f, 0.0f),
               Error);
}

// GPT-2's GELU (the tanh form) and its derivative, in fp64.
double gelu64(double x) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * x * (1.0 + t);
}
double gelu_derivative64(double x) {
  const double c = std::sqrt(2.0 / M_PI), t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// GELU in the bf16 products' epilogues (PrecisionGemm::pre_gelu16, gelu_input16: a GELU MLP's
// Mlp::fuses_gelu): the up projection's forward leaves its output (after the bf16 bias) and GELU
// of it, the down projection's dgrad the GELU input's gradient and its column sums (the up
// projection's bias gradient, added into what is there): each within 1e-2 of fp64 on the bf16
// operands, and of the unfused path (the GEMM, then the activation's kernels) on the same GPU.
TEST_F(CudaGemm, GeluEpiloguesAreTheActivationPassesWithinBf16) {
  const Device gpu = Device::cuda(0);
  const int64_t n = 320, width = 96, ffn = 384;  // tokens, d_model, ffn (a multiple of 8)
  const std::vector<float> x = bf16_rounded(random_values(seed_, n * width, 1.0f));
  const std::vector<float> w_up = bf16_rounded(random_values(seed_ + 1, ffn * width, 0.15f));
  const std::vector<float> bias = random_values(seed_ + 2, ffn, 0.5f);
  const std::vector<float> w_down = bf16_rounded(random_values(seed_ + 3, width * ffn, 0.08f));
  const std::vector<float> dout = bf16_rounded(random_values(seed_ + 4, n * width, 1.0f));
  const std::vector<float> bias16 = bf16_rounded(bias);
  // fp64: pre = x . W_up^T + bias16; act = gelu(pre); d_hidden = (dout . W_down) * gelu'(pre16).
  const std::vector<double> up = product_nt(x, w_up, n, ffn, width);
  std::vector<double> pre(up.size()), act(up.size());
  for (size_t i = 0; i < up.size(); ++i) {
    pre[i] = up[i] + bias16[i % ffn];
    act[i] = gelu64(pre[i]);
  }
  std::vector<float> w_down_t(w_down.size());  // [ffn, width]: dout . W_down = dout . (W_down^T)^T
  for (int64_t o = 0; o < width; ++o)
    for (int64_t f = 0; f < ffn; ++f) w_down_t[f * width + o] = w_down[o * ffn + f];
  const std::vector<double> d_act = product_nt(dout, w_down_t, n, ffn, width);
  DeviceFloats d_x(allocator_, x), d_w_up(allocator_, w_up), d_bias(allocator_, bias), d_w_down(allocator_, w_down),
      d_dout(allocator_, dout);
  DeviceArray<__nv_bfloat16> d_x16(allocator_, to_bf16(x)), d_dout16(allocator_, to_bf16(dout));
  auto bf16_out = [&] { return DeviceArray<__nv_bfloat16>(allocator_, to_bf16(poison(n * ffn))); };
  DeviceArray<__nv_bfloat16> d_pre = bf16_out(), d_act16 = bf16_out(), d_hidden = bf16_out();
  PrecisionGemm forward;
  forward.pass = LinearGemm::Forward;
  forward.a = CastOperand{d_x.ptr, OperandCast::Bf16};
  forward.b = CastOperand{d_w_up.ptr, OperandCast::Bf16};
  forward.a16 = d_x16.ptr;
  forward.bias = d_bias.ptr;
  forward.n = n, forward.in_features = width, forward.out_features = ffn;
  forward.out16 = d_act16.ptr;
  forward.pre_gelu16 = d_pre.ptr;
  kernels::precision_linear_gemm(gpu, forward);
  const std::vector<float> pre16 = to_float(d_pre.host()), act16 = to_float(d_act16.host());
  EXPECT_LE(relative_error(pre16, pre), 1e-2) << "seed " << seed_;
  EXPECT_LE(relative_error(act16, act), 1e-2) << "seed " << seed_;
  std::vector<double> d_hidden_want(d_act.size()), bias_grad_want(ffn, 0.25);  // added into 0.25
  for (size_t i = 0; i < d_act.size(); ++i) {
    d_hidden_want[i] = d_act[i] * gelu_derivative64(pre16[i]);
    bias_grad_want[i % ffn] += d_hidden_want[i];
  }
  DeviceFloats d_bias_grad(allocator_, std::vector<float>(ffn, 0.25f));
  PrecisionGemm dgrad;
  dgrad.pass = LinearGemm::DataGrad;
  dgrad.a = CastOperand{d_dout.ptr, OperandCast::Bf16};
  dgrad.b = CastOperand{d_w_down.ptr, OperandCast::Bf16};
  dgrad.a16 = d_dout16.ptr;
  dgrad.n = n, dgrad.in_features = ffn, dgrad.out_features = width;
  dgrad.out16 = d_hidden.ptr;
  dgrad.gelu_input16 = d_pre.ptr;
  dgrad.gelu_bias_grad = d_bias_grad.ptr;
  kernels::precision_linear_gemm(gpu, dgrad);
  const std::vector<float> hidden16 = to_float(d_hidden.host());
  EXPECT_LE(relative_error(hidden16, d_hidden_want), 1e-2) << "seed " << seed_;
  EXPECT_LE(relative_error(d_bias_grad.host(), bias_grad_want), 1e-2) << "seed " << seed_;
  // The unfused path on the same GPU: the products into bf16, then the activation's kernels.
  DeviceArray<__nv_bfloat16> d_pre_unfused = bf16_out(), d_act_unfused = bf16_out(), d_dact = bf16_out(),
                             d_hidden_unfused = bf16_out();
  forward.pre_gelu16 = nullptr;
  forward.out16 = d_pre_unfused.ptr;
  kernels::precision_linear_gemm(gpu, forward);
  kernels::activation_forward_bf16(gpu, MlpActivation::Gelu, nullptr, d_act_unfused.ptr, d_pre_unfused.ptr, n, ffn);
  dgrad.gelu_input16 = nullptr;
  dgrad.gelu_bias_grad = nullptr;
  dgrad.out16 = d_dact.ptr;
  kernels::precision_linear_gemm(gpu, dgrad);
  DeviceFloats d_bias_grad_unfused(allocator_, std::vector<float>(ffn, 0.25f));
  kernels::activation_backward_bf16(gpu, MlpActivation::Gelu, nullptr, d_hidden_unfused.ptr, d_bias_grad_unfused.ptr,
                                    d_dact.ptr, d_pre.ptr, n, ffn);
  EXPECT_LE(relative_error(pre16, to_float(d_pre_unfused.host())), 1e-2);
  EXPECT_LE(relative_error(act16, to_float(d_act_unfused.host())), 1e-2);
  EXPECT_LE(relative_error(hidden16, to_float(d_hidden_unfused.host())), 1e-2);
  EXPECT_LE(relative_error(d_bias_grad.host(), d_bias_grad_unfused.host()), 1e-2);
  // Refused, naming the rule: GELU's derivative into an fp32 output.
  dgrad.out16 = nullptr;
  dgrad.gelu_input16 = d_pre.ptr;
  DeviceFloats d_din32(allocator_, poison(n * ffn));
  dgrad.out = d_din32.ptr;
  EXPECT_THROW(kernels::precision_linear_gemm(gpu, dgrad), Error);
}

// Quantised copies of a[m, k] and b[n, k] on the device for FP8 products.
struct Fp8Operand {
  std::vector<float> dequantized;  // what the product should see, in fp32 (precision's reference)
  std::unique_ptr<DeviceArray<uint8_t>> codes;
  std::unique_ptr<DeviceFloats> scales;  // scale inverses, as cuBLASLt multiplies them in
};

Fp8Operand per_tensor(CachingAllocator& allocator, const std::vector<float>& x, Fp8 f) {
  const precision::Fp8Format cf = f == Fp8::E4M3 ? precision::Fp8Format::E4M3 : precision::Fp8Format::E5M2;
  const float scale = precision::compute_scale(precision::amax(x.data(), static_cast<int64_t>(x.size())),
                                               precision::max_finite(cf));
  Fp8Operand op;
  op.dequantized = x;
  precision::quantize_dequantize_fp8(op.dequantized.data(), static_cast<int64_t>(x.size()), cf, scale);
  DeviceFloats d_x(allocator, x);
  op.codes = std::make_unique<DeviceArray<uint8_t>>(allocator, std::vector<uint8_t>(x.size()));
  op.scales = std::make_unique<DeviceFloats>(allocator, std::vector<float>{1.0f / scale});
  encode_fp8(d_x.ptr, op.codes->ptr, static_cast<int64_t>(x.size()), f, scale);
  return op;
}

// With and without cuBLASLt's fast accumulation (the forward products' default). Its running sums
// are narrower than fp32 (about 14 bits kept, as DeepSeek-V3 reports for Hopper) and never promoted,
// so over k = 8192 its error may pass 1e-3: it is held to 1e-2, which any wrong scale, layout or
// operand still breaks by orders of magnitude, and the error is printed.
TEST_F(CudaGemm, Fp8PerTensorIsNearTheQuantisedProduct) {
  using Shape = std::tuple<int64_t, int64_t, int64_t>;
  for (const bool fast : {false, true}) {
    for (auto [fa, fb] : {std::pair<Fp8, Fp8>{Fp8::E4M3, Fp8::E4M3}, {Fp8::E4M3, Fp8::E5M2}}) {
      for (auto [m, n, k] : {Shape{16, 32, 48}, Shape{512, 256, 1024}, Shape{256, 128, 8192}}) {
        const std::vector<float> a = random_values(seed_, m * k, 1.0f), b = random_values(seed_ + 1, n * k, 0.1f);
        const Fp8Operand qa = per_tensor(allocator_, a, fa), qb = per_tensor(allocator_, b, fb);
        DeviceFloats d_c(allocator_, poison(m * n));
        const GemmType ta = fa == Fp8::E4M3 ? GemmType::E4M3 : GemmType::E5M2;
        const GemmType tb = fb == Fp8::E4M3 ? GemmType::E4M3 : GemmType::E5M2;
        matmul(GemmOutput{d_c.ptr, GemmType::F32, nullptr, fast},
               GemmOperand{qa.codes->ptr, ta, false, qa.scales->ptr, ScaleMode::Tensor},
               GemmOperand{qb.codes->ptr, tb, true, qb.scales->ptr, ScaleMode::Tensor}, m, n, k, 1.0f, 0.0f);
        const double error = relative_error(d_c.host(), product_nt(qa.dequantized, qb.dequantized, m, n, k));
        const std::string what = std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                                 " b e5m2 " + std::to_string(fb == Fp8::E5M2) + " fast accumulation " +
                                 std::to_string(fast);
        std::printf("fp8 per-tensor %s: relative error %.3g\n", what.c_str(), error);
        EXPECT_LE(error, fast ? 1e-2 : 1e-3) << what;
      }
    }
  }
}

// Each 1 x 128 run of a and each 128 x 128 tile of b scaled by its own power of two (2^-4 .. 2^4),
// so their scales differ by up to 2^8: a scale read from the wrong run or tile is far off.
void scale_blocks(std::vector<float>& x, int64_t rows, int64_t cols, int64_t block_rows, int step) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t block = (r / block_rows) * step + (c / 128) * 3;
      x[static_cast<size_t>(r * cols + c)] *= std::ldexp(1.0f, static_cast<int>(block % 9) - 4);
    }
  }
}

TEST_F(CudaGemm, Fp8BlockwiseIsWithin1e3OfTheQuantisedProduct) {
  const int64_t m = 256, n = 384, k = 512;
  std::vector<float> a = random_values(seed_, m * k, 1.0f), b = random_values(seed_ + 1, n * k, 0.1f);
  scale_blocks(a, m, k, 1, 7);
  scale_blocks(b, n, k, 128, 5);
  std::vector<float> qa = a, qb = b;
  precision::quantize_dequantize_rowwise_blocks(qa.data(), m, k);  // activations: 1 x 128 runs
  precision::quantize_dequantize_tile_blocks(qb.data(), n, k);     // weights: 128 x 128 tiles
  DeviceFloats d_a(allocator_, a), d_b(allocator_, b), d_sa(allocator_, poison(m * (k / 128))),
      d_sb(allocator_, poison(blockwise_tile_scale_count(n, k))), d_c(allocator_, poison(m * n));
  DeviceArray<uint8_t> d_ca(allocator_, std::vector<uint8_t>(m * k)), d_cb(allocator_, std::vector<uint8_t>(n * k));
  encode_rowwise_blocks(d_a.ptr, d_ca.ptr, d_sa.ptr, m, k, Fp8::E4M3);
  encode_tile_blocks(d_b.ptr, d_cb.ptr, d_sb.ptr, n, k, Fp8::E4M3);
  matmul(GemmOutput{d_c.ptr, GemmType::F32}, GemmOperand{d_ca.ptr, GemmType::E4M3, false, d_sa.ptr, ScaleMode::Vec128},
         GemmOperand{d_cb.ptr, GemmType::E4M3, true, d_sb.ptr, ScaleMode::Block128x128}, m, n, k, 1.0f, 0.0f);
  EXPECT_LE(relative_error(d_c.host(), product_nt(qa, qb, m, n, k)), 1e-3);
}

TEST_F(CudaGemm, Mxfp8EmulatedIsWithin1e5OfTheQuantisedProduct) {
  const int64_t m = 96, n = 160, k = 320;
  const std::vector<float> a = random_values(seed_, m * k, 1.0f), b = random_values(seed_ + 1, n * k, 0.1f);
  std::vector<float> qa = a, qb = b;
  precision::quantize_dequantize_mx(qa.data(), m, k, precision::Fp8Format::E4M3);
  precision::quantize_dequantize_mx(qb.data(), n, k, precision::Fp8Format::E4M3);
  DeviceFloats d_a(allocator_, a), d_b(allocator_, b), d_c(allocator_, poison(m * n));
  DeviceArray<uint8_t> d_ca(allocator_, std::vector<uint8_t>(m * k)), d_cb(allocator_, std::vector<uint8_t>(n * k)),
      d_sa(allocator_, std::vector<uint8_t>(m * k / 32)), d_sb(allocator_, std::vector<uint8_t>(n * k / 32));
  encode_mx(d_a.ptr, m, k, Fp8::E4M3, d_ca.ptr, d_sa.ptr);
  encode_mx(d_b.ptr, n, k, Fp8::E4M3, d_cb.ptr, d_sb.ptr);
  mxfp8_matmul_emulated(GemmOutput{d_c.ptr, GemmType::F32}, d_ca.ptr, d_sa.ptr, d_cb.ptr, d_sb.ptr, false, m, n, k);
  EXPECT_LE(relative_error(d_c.host(), product_nt(qa, qb, m, n, k)), 1e-5);
}

}  // namespace
}  // namespace loom::kernels::cuda

namespace loom::kernels::cuda {
namespace {

// Plans made with LOOM_GEMM_AUTOTUNE's timing (set_gemm_autotune_candidates: 8 of cuBLASLt's
// candidates run on a scratch output, the fastest kept) compute the same products, and the timing
// runs leave the caller's output alone: accumulating (beta 1) into random values adds the product
// once. Shapes no other test uses, so their plans are made here: fp32, bf16 and per-tensor FP8.
TEST_F(CudaGemm, AutotunedPlansComputeTheSameProductsAndLeaveTheOutputAlone) {
  struct Candidates {
    Candidates() { set_gemm_autotune_candidates(8); }
    ~Candidates() { set_gemm_autotune_candidates(0); }
  } tuning;
  auto plus = [](const std::vector<float>& start, std::vector<double> product) {
    for (size_t i = 0; i < product.size(); ++i) product[i] += start[i];
    return product;
  };
  {  // fp32 operands, c [130, 70] += a [130, 333] . b [70, 333]^T
    const int64_t m = 130, n = 70, k = 333;
    const std::vector<float> a = random_values(seed_, m * k, 1.0f), b = random_values(seed_ + 1, n * k, 1.0f),
                             start = random_values(seed_ + 2, m * n, 1.0f);
    DeviceFloats d_a(allocator_, a), d_b(allocator_, b), d_c(allocator_, start);
    gemm(d_c.ptr, d_a.ptr, d_b.ptr, m, n, k, false, true, true);
    EXPECT_LE(relative_error(d_c.host(), plus(start, product_nt(a, b, m, n, k))), 1e-5) << "fp32";
  }
  {  // bf16 operands into fp32, accumulating: (777, 345, 1040)
    const int64_t m = 777, n = 345, k = 1040;
    const std::vector<float> a = random_values(seed_ + 3, m * k, 1.0f), b = random_values(seed_ + 4, n * k, 1.0f),
                             start = random_values(seed_ + 5, m * n, 10.0f);
    std::vector<__nv_bfloat16> ab(a.size()), bb(b.size());
    std::vector<float> a_rounded(a.size()), b_rounded(b.size());
    for (size_t i = 0; i < a.size(); ++i) a_rounded[i] = __bfloat162float(ab[i] = __float2bfloat16(a[i]));
    for (size_t i = 0; i < b.size(); ++i) b_rounded[i] = __bfloat162float(bb[i] = __float2bfloat16(b[i]));
    DeviceArray<__nv_bfloat16> d_a(allocator_, ab), d_b(allocator_, bb);
    DeviceFloats d_c(allocator_, start);
    matmul(GemmOutput{d_c.ptr, GemmType::F32}, GemmOperand{d_a.ptr, GemmType::BF16, false},
           GemmOperand{d_b.ptr, GemmType::BF16, true}, m, n, k, 1.0f, 1.0f);
    EXPECT_LE(relative_error(d_c.host(), plus(start, product_nt(a_rounded, b_rounded, m, n, k))), 1e-5) << "bf16";
  }
  {  // per-tensor E4M3 x E4M3 into fp32: (528, 272, 1040)
    const int64_t m = 528, n = 272, k = 1040;
    const std::vector<float> a = random_values(seed_ + 6, m * k, 1.0f), b = random_values(seed_ + 7, n * k, 0.1f);
    const Fp8Operand qa = per_tensor(allocator_, a, Fp8::E4M3), qb = per_tensor(allocator_, b, Fp8::E4M3);
    DeviceFloats d_c(allocator_, poison(m * n));
    matmul(GemmOutput{d_c.ptr, GemmType::F32},
           GemmOperand{qa.codes->ptr, GemmType::E4M3, false, qa.scales->ptr, ScaleMode::Tensor},
           GemmOperand{qb.codes->ptr, GemmType::E4M3, true, qb.scales->ptr, ScaleMode::Tensor}, m, n, k, 1.0f, 0.0f);
    EXPECT_LE(relative_error(d_c.host(), product_nt(qa.dequantized, qb.dequantized, m, n, k)), 1e-3) << "fp8";
  }
}

// Argument checks come before any CUDA call, so these run (and must pass) without a GPU too.
TEST(CudaGemmArguments, AutotuneCountsOutsideTheRangeAreErrors) {
  for (const int bad : {-1, 33}) {
    try {
      set_gemm_autotune_candidates(bad);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("set_gemm_autotune_candidates(" + std::to_string(bad) + ")"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CudaGemmArguments, Fp8RulesAreErrorsNamingWhatIsWrong) {
  const float scale = 1.0f;
  const GemmOutput out{nullptr, GemmType::F32};
  auto message = [&](int64_t m, int64_t n, int64_t k, bool a_t, bool b_t, GemmType tb) {
    try {
      matmul(out, GemmOperand{&scale, GemmType::E4M3, a_t, &scale, ScaleMode::Tensor},
             GemmOperand{&scale, tb, b_t, &scale, ScaleMode::Tensor}, m, n, k, 1.0f, 0.0f);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(16, 16, 24, false, true, GemmType::E4M3).find("multiples of 16, got (16, 16, 24)"),
            std::string::npos);
  EXPECT_NE(message(16, 16, 16, true, true, GemmType::E4M3).find("c = a . b^T"), std::string::npos);
  EXPECT_NE(message(16, 16, 16, false, true, GemmType::BF16).find("two FP8 operands"), std::string::npos);
  try {  // fast accumulation asked of a bf16 product
    matmul(GemmOutput{nullptr, GemmType::F32, nullptr, true}, GemmOperand{&scale, GemmType::BF16, false},
           GemmOperand{&scale, GemmType::BF16, true}, 16, 16, 16, 1.0f, 0.0f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fast accumulation is for per-tensor FP8 products only"), std::string::npos);
  }
}

TEST(CudaFlashAttentionArguments, HeadDimBeyondTheKernelsIsAnError) {
  const FlashAttentionShape s{1, 4, 4, 2, 2, 512, 1024, 1024, 1024, 1024};
  try {
    flash_attention_forward(static_cast<float*>(nullptr), nullptr, static_cast<const float*>(nullptr), nullptr,
                            nullptr, s, AttentionVisibility{});
    FAIL() << "no error for head_dim 512";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 512 is outside [1, 256]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::kernels::cuda
