// Every precision recipe's linear-layer GEMMs on the GPU (model::LinearPrecision on
// Device::cuda(0), through kernels::precision_linear_gemm) against the CPU's emulation of the
// same recipe on the same inputs: forward (with bias, stored and accumulated; a tensor-parallel
// partial product unrounded, then rounded on the device), dgrad and wgrad into non-zero gradients.
// Tolerances (relative, in the norm of each GEMM's contribution):
// - against the fp64 product of the operands as the CPU quantizes them (LinearPrecision::prepare),
//   rounded to the recipe's dtype (but the weight gradient, added unrounded): 1e-3. Both sides
//   multiply the same values; the GPU accumulates
//   in fp32 in another order, so an output differs only where that order moves its fp32 sum
//   across a bf16 / fp16 rounding boundary (one ulp, 2^-8 relative, for a fraction of the outputs
//   near 2^-24 / 2^-8: a norm error far below 1e-3), plus the FP8 scale inverse cuBLASLt
//   multiplies by being 1 / scale rounded once (2^-24 relative);
// - against the CPU emulation's own output: 1e-3, for the same reasons;
// - bf16 and fp16 also against the fp64 product of the unrounded fp32 inputs: 1e-2 (the issue's
//   bound for 16-bit kernels; two operand roundings of 2^-9 and an output rounding).
// Sizes are awkward where the format allows (bf16, fp16, mxfp8: 77 tokens, 200 -> 136 features)
// and multiples of what cuBLASLt's FP8 products require otherwise (16 per tensor, 128 blockwise).
// fp8_delayed's amax histories and scales after several steps equal the CPU's exactly; an operand
// holding Inf or NaN makes NaN exactly the outputs the CPU's (unquantized) GEMM makes Inf or NaN. Under tensor parallelism (two ranks as threads on the one GPU) fp8_current
// scales each piece by the whole tensor's amax, so the pieces compute what one rank does. The
// recipe routing and shape rules run without a GPU too.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "precision_shapes.h"
#include "loom/comm/device_staging.h"
#include "loom/comm/launch.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/linear_precision.h"
#include "loom/precision/formats.h"
#include "loom/precision/fp8_scaling.h"

namespace loom::kernels::cuda {
namespace {

using model::GemmPass;
using model::LinearPrecision;
using model::Operand;
using model::Recipe;
using testing::DeviceArray;
using testing::DeviceFloats;
using testing::poison;
using testing::random_values;
using testing::Sizes;
using testing::sizes_for;


// One layer's inputs; the initial gradients are about a tenth of what the GEMMs add, so an error
// in the added part is not hidden by them.
struct LayerData {
  Sizes s;
  std::vector<float> x, w, b, dy, out0, dx0, dw0, db0;
};

LayerData make_data(uint32_t seed, Sizes s) {
  LayerData d{s, {}, {}, {}, {}, {}, {}, {}, {}};
  d.x = random_values(seed, s.n * s.in, 1.0f);
  d.w = random_values(seed + 1, s.out * s.in, 0.1f);
  d.b = random_values(seed + 2, s.out, 0.5f);
  d.dy = random_values(seed + 3, s.n * s.out, 0.01f);
  d.out0 = random_values(seed + 4, s.n * s.out, 0.1f);
  d.dx0 = random_values(seed + 5, s.n * s.in, 0.001f);
  d.dw0 = random_values(seed + 6, s.out * s.in, 0.01f);
  d.db0 = random_values(seed + 7, s.out, 0.01f);
  return d;
}

// out: forward with bias into a poisoned output; out_acc: forward without bias added into out0.
struct LayerResult {
  std::vector<float> out, out_acc, dx, dw, db;
};

LayerResult run_cpu(LinearPrecision& lp, const LayerData& d) {
  const Sizes s = d.s;
  LayerResult r{poison(s.n * s.out), d.out0, d.dx0, d.dw0, d.db0};
  lp.forward(r.out.data(), d.x.data(), d.w.data(), d.b.data(), s.n, s.in, s.out, false);
  lp.forward(r.out_acc.data(), d.x.data(), d.w.data(), nullptr, s.n, s.in, s.out, true);
  lp.backward(r.dx.data(), r.dw.data(), r.db.data(), d.dy.data(), d.x.data(), d.w.data(), s.n, s.in, s.out);
  return r;
}

LayerResult run_gpu(LinearPrecision& lp, const LayerData& d, CachingAllocator& a) {
  const Sizes s = d.s;
  DeviceFloats x(a, d.x), w(a, d.w), b(a, d.b), dy(a, d.dy), out(a, poison(s.n * s.out)), out_acc(a, d.out0),
      dx(a, d.dx0), dw(a, d.dw0), db(a, d.db0);
  lp.forward(out.ptr, x.ptr, w.ptr, b.ptr, s.n, s.in, s.out, false);
  lp.forward(out_acc.ptr, x.ptr, w.ptr, nullptr, s.n, s.in, s.out, true);
  lp.backward(dx.ptr, dw.ptr, db.ptr, dy.ptr, x.ptr, w.ptr, s.n, s.in, s.out);
  return {out.host(), out_acc.host(), dx.host(), dw.host(), db.host()};
}

// c[m, n] = sum_k A(i, k) B(k, j) in fp64, A and B read through index functions.
template <typename A, typename B>
std::vector<double> product(int64_t m, int64_t n, int64_t k, A a, B b) {
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) sum += static_cast<double>(a(i, p)) * static_cast<double>(b(p, j));
      c[static_cast<size_t>(i * n + j)] = sum;
    }
  return c;
}

// The reference GEMMs of the layer: fp64 products of the given operand values (prepare's copies, or
// the raw inputs), the forward with the bias, each (and the bias) rounded to the recipe's dtype when asked.
struct Reference {
  std::vector<double> out, dx, dw;
};

std::vector<double> rounded(std::vector<double> v, Recipe recipe, bool round) {
  if (!round) return v;
  for (double& x : v) {
    float f = static_cast<float>(x);
    if (recipe == Recipe::Fp16) {
      precision::round_to_fp16(&f, 1);
    } else {
      precision::round_to_bf16(&f, 1);
    }
    x = f;
  }
  return v;
}

Reference reference(const LayerData& d, const std::vector<float>& x_fwd, const std::vector<float>& w_fwd,
                    const std::vector<float>& g_dgrad, const std::vector<float>& w_dgrad,
                    const std::vector<float>& g_wgrad, const std::vector<float>& x_wgrad, Recipe recipe, bool round) {
  const Sizes s = d.s;
  Reference r;
  r.out = product(s.n, s.out, s.in, [&](int64_t i, int64_t p) { return x_fwd[i * s.in + p]; },
                  [&](int64_t p, int64_t j) { return w_fwd[j * s.in + p]; });
  // The bias as the recipe adds it: rounded to the output's dtype first.
  const std::vector<double> bias = rounded(std::vector<double>(d.b.begin(), d.b.end()), recipe, round);
  for (int64_t i = 0; i < s.n * s.out; ++i) r.out[i] += bias[i % s.out];
  r.out = rounded(r.out, recipe, round);
  r.dx = rounded(product(s.n, s.in, s.out, [&](int64_t i, int64_t p) { return g_dgrad[i * s.out + p]; },
                         [&](int64_t p, int64_t j) { return w_dgrad[p * s.in + j]; }),
                 recipe, round);
  // The weight gradient is added unrounded into the fp32 main gradient (by the GEMM itself).
  r.dw = product(s.out, s.in, s.n, [&](int64_t i, int64_t p) { return g_wgrad[p * s.out + i]; },
                 [&](int64_t p, int64_t j) { return x_wgrad[p * s.in + j]; });
  return r;
}

// The operands as the CPU emulation quantizes them for each GEMM (a fresh object: same scales).
Reference quantized_reference(Recipe recipe, const LayerData& d) {
  LinearPrecision lp(recipe);
  const Sizes s = d.s;
  auto copy = [](const float* p, int64_t n) { return std::vector<float>(p, p + n); };
  const auto xf = copy(lp.prepare(Operand::Input, GemmPass::Forward, d.x.data(), s.n, s.in), s.n * s.in);
  const auto wf = copy(lp.prepare(Operand::Weight, GemmPass::Forward, d.w.data(), s.out, s.in), s.out * s.in);
  const auto gd = copy(lp.prepare(Operand::OutputGrad, GemmPass::DataGrad, d.dy.data(), s.n, s.out), s.n * s.out);
  const auto wd = copy(lp.prepare(Operand::Weight, GemmPass::DataGrad, d.w.data(), s.out, s.in), s.out * s.in);
  const auto gw = copy(lp.prepare(Operand::OutputGrad, GemmPass::WeightGrad, d.dy.data(), s.n, s.out), s.n * s.out);
  const auto xw = copy(lp.prepare(Operand::Input, GemmPass::WeightGrad, d.x.data(), s.n, s.in), s.n * s.in);
  return reference(d, xf, wf, gd, wd, gw, xw, recipe, true);
}

// ||(got - init) - want|| / ||want||: the error of what a GEMM added.
double added_error(const std::vector<float>& got, const std::vector<float>& init, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]) - (init.empty() ? 0.0 : static_cast<double>(init[i]));
    if (!std::isfinite(g)) return INFINITY;
    diff += (g - want[i]) * (g - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}
std::vector<double> widened(const std::vector<float>& got, const std::vector<float>& init) {
  std::vector<double> out(got.size());
  for (size_t i = 0; i < got.size(); ++i)
    out[i] = static_cast<double>(got[i]) - (init.empty() ? 0.0 : static_cast<double>(init[i]));
  return out;
}

void expect_close(const LayerResult& got, const LayerData& d, const Reference& want, double tolerance,
                  const std::string& what) {
  EXPECT_LE(added_error(got.out, {}, want.out), tolerance) << what << ": forward";
  EXPECT_LE(added_error(got.dx, d.dx0, want.dx), tolerance) << what << ": dgrad";
  EXPECT_LE(added_error(got.dw, d.dw0, want.dw), tolerance) << what << ": wgrad";
}

class CudaLinearPrecision : public testing::GpuTest<::testing::TestWithParam<Recipe>> {};

TEST_P(CudaLinearPrecision, ForwardDgradAndWgradMatchTheCpuEmulation) {
  const Recipe recipe = GetParam();
  const LayerData d = make_data(seed_, sizes_for(recipe));
  LinearPrecision cpu(recipe), gpu(recipe);
  gpu.set_device(Device::cuda(0));
  const LayerResult want = run_cpu(cpu, d), got = run_gpu(gpu, d, allocator_);
  const std::string name = model::recipe_name(recipe);

  // The quantized operands' fp64 products, rounded to the recipe's dtype.
  expect_close(got, d, quantized_reference(recipe, d), 1e-3, name + " against the quantized operands' fp64 product");
  // The CPU emulation's own outputs (what the GEMM added to each).
  const Reference cpu_added{widened(want.out, {}), widened(want.dx, d.dx0), widened(want.dw, d.dw0)};
  expect_close(got, d, cpu_added, 1e-3, name + " against the CPU emulation");
  // The accumulating forward adds the product without the bias, rounded on its own.
  const std::vector<double> acc_want = widened(want.out_acc, d.out0);
  EXPECT_LE(added_error(got.out_acc, d.out0, acc_want), 1e-3) << name << ": accumulated forward";
  // The bias gradient stays fp32: the column sums of dy.
  EXPECT_LE(testing::relative_error(got.db, want.db), 1e-5) << name << ": bias gradient";
  if (recipe == Recipe::Bf16 || recipe == Recipe::Fp16) {
    const Reference raw = reference(d, d.x, d.w, d.dy, d.w, d.dy, d.x, recipe, false);
    expect_close(got, d, raw, 1e-2, name + " against the fp64 product of the fp32 inputs");
  }
  // A tensor-parallel partial product stays fp32: few outputs with their low 16 bits all zero (a
  // wrongly applied bf16 rounding would zero every one): under 1% by chance, under 10% for
  // per-tensor FP8, whose products of coarse codes sum exactly to such values more often (577 of
  // 15360 under fp8_delayed's first scale on an H200), and close to the CPU's: within 1e-4
  // for the 16-bit products; FP8 tensor cores add their partial sums in fewer bits between
  // cuBLASLt's promotions to fp32, so 5e-4 there (a bf16 rounding alone would be ~1e-3). Then
  // round_output rounds it on the device as on the CPU.
  {
    const Sizes s = d.s;
    std::vector<float> partial(s.n * s.out, NAN);
    cpu.forward(partial.data(), d.x.data(), d.w.data(), nullptr, s.n, s.in, s.out, false, model::GemmOutput::Partial);
    DeviceFloats x(allocator_, d.x), w(allocator_, d.w), p(allocator_, poison(s.n * s.out));
    gpu.forward(p.ptr, x.ptr, w.ptr, nullptr, s.n, s.in, s.out, false, model::GemmOutput::Partial);
    const std::vector<float> got_partial = p.host();
    int64_t low_bits_zero = 0;
    for (const float v : got_partial) low_bits_zero += (std::bit_cast<uint32_t>(v) & 0xffffu) == 0 ? 1 : 0;
    const bool tensor_fp8 = recipe == Recipe::Fp8Delayed || recipe == Recipe::Fp8Current;
    EXPECT_LT(low_bits_zero, tensor_fp8 ? s.n * s.out / 10 : std::max<int64_t>(4, s.n * s.out / 100))
        << name << ": partial forward looks rounded";
    const double partial_bound = model::is_fp8(recipe) && recipe != Recipe::Mxfp8 ? 5e-4 : 1e-4;
    const double partial_error = testing::relative_error(got_partial, partial);
    EXPECT_LE(partial_error, partial_bound) << name << ": partial forward";
    std::printf("%s: partial forward within %.2e of the CPU's\n", name.c_str(), partial_error);
    cpu.round_output(partial.data(), s.n * s.out);
    gpu.round_output(p.ptr, s.n * s.out);
    EXPECT_LE(testing::relative_error(p.host(), partial), 1e-3) << name << ": partial forward rounded";
  }
  // The delayed scaling's pending amaxes are the CPU's, bit for bit.
  for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad})
    EXPECT_EQ(gpu.pending_amax(op), cpu.pending_amax(op)) << name << " operand " << static_cast<int>(op);
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, CudaLinearPrecision,
                         ::testing::Values(Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current,
                                           Recipe::Fp8Blockwise, Recipe::Mxfp8),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return model::recipe_name(info.param); });

class CudaLinearPrecisionState : public testing::GpuTest<> {};

TEST_F(CudaLinearPrecisionState, DelayedScalingHistoriesAndScalesEqualTheCpuAfterSeveralSteps) {
  const Sizes s = sizes_for(Recipe::Fp8Delayed);
  LinearPrecision cpu(Recipe::Fp8Delayed, 4), gpu(Recipe::Fp8Delayed, 4);
  gpu.set_device(Device::cuda(0));
  for (int step = 0; step < 6; ++step) {
    LayerData d = make_data(seed_ + 100 * step, s);
    for (float& v : d.dy) v *= std::ldexp(1.0f, step - 3);  // ranges that move, so the scales do
    const LayerResult want = run_cpu(cpu, d), got = run_gpu(gpu, d, allocator_);
    EXPECT_LE(added_error(got.dw, d.dw0, widened(want.dw, d.dw0)), 1e-3) << "step " << step;
    float amaxes[3];
    for (int op = 0; op < 3; ++op) {
      amaxes[op] = cpu.pending_amax(static_cast<Operand>(op));
      EXPECT_EQ(gpu.pending_amax(static_cast<Operand>(op)), amaxes[op]) << "step " << step << " operand " << op;
    }
    cpu.commit_amaxes(amaxes);
    gpu.commit_amaxes(amaxes);  // as the trainer does with the max over the ranks
  }
  for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
    const precision::DelayedScalingState &c = cpu.delayed_scaling(op).state(), &g = gpu.delayed_scaling(op).state();
    EXPECT_EQ(g.amax_history, c.amax_history) << static_cast<int>(op);
    EXPECT_EQ(g.next, c.next);
    EXPECT_EQ(g.scale, c.scale);
    EXPECT_NE(c.scale, 1.0f);  // the scales did move
  }
}

TEST_F(CudaLinearPrecisionState, AnOperandWithInfOrNanMakesTheCpusNonFiniteOutputsNan) {
  for (Recipe recipe : {Recipe::Fp8Current, Recipe::Fp8Delayed, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    LayerData d = make_data(seed_, sizes_for(recipe));
    d.x[5 * d.s.in + 3] = INFINITY;  // token 5 of the input
    d.dy[7 * d.s.out + 1] = NAN;     // token 7 of the output gradient
    LinearPrecision cpu(recipe), gpu(recipe);
    gpu.set_device(Device::cuda(0));
    const LayerResult want = run_cpu(cpu, d), got = run_gpu(gpu, d, allocator_);
    const std::string name = model::recipe_name(recipe);
    auto same_non_finite = [&](const std::vector<float>& g, const std::vector<float>& w, const char* what) {
      int64_t non_finite = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        non_finite += !std::isfinite(w[i]);
        ASSERT_EQ(std::isfinite(g[i]), std::isfinite(w[i])) << name << " " << what << " element " << i;
        if (!std::isfinite(w[i])) {
          ASSERT_TRUE(std::isnan(g[i])) << name << " " << what << " element " << i;
        }
      }
      EXPECT_GT(non_finite, 0) << name << " " << what;
      // The finite elements differ: the CPU multiplies the operand unquantized, the device quantized.
    };
    same_non_finite(got.out, want.out, "forward");
    same_non_finite(got.dx, want.dx, "dgrad");
    same_non_finite(got.dw, want.dw, "wgrad");
    if (recipe == Recipe::Fp8Delayed) {
      EXPECT_TRUE(std::isinf(gpu.pending_amax(Operand::Input)));
      EXPECT_TRUE(std::isinf(gpu.pending_amax(Operand::OutputGrad)));
      EXPECT_EQ(gpu.pending_amax(Operand::Weight), cpu.pending_amax(Operand::Weight));
    }
  }
}

// A column-parallel layer at tp 2: each rank holds half of W's rows and of dy's columns (pieces),
// the input whole. Rank 1's piece is ~50x smaller than rank 0's, so scaling it by its own amax
// would quantize it differently (the ratio is no power of two); with the group's max both pieces
// quantize as one rank's whole tensor, and the forward and wgrad pieces match one CPU rank's.
TEST_F(CudaLinearPrecisionState, Fp8CurrentUnderTensorParallelismScalesPiecesByTheWholeTensorsAmax) {
  const int64_t n = 64, in = 96, out = 128, half = out / 2;
  const std::vector<float> x = random_values(seed_, n * in, 1.0f), dy = random_values(seed_ + 1, n * out, 0.01f);
  std::vector<float> w = random_values(seed_ + 2, out * in, 0.1f);
  for (int64_t i = half * in; i < out * in; ++i) w[i] /= 50.0f;
  LinearPrecision whole(Recipe::Fp8Current);
  std::vector<float> y(n * out, NAN), dw(out * in, 0.0f);
  whole.forward(y.data(), x.data(), w.data(), nullptr, n, in, out);
  whole.backward(nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), n, in, out);
  std::vector<std::unique_ptr<DeviceFloats>> w_piece, dy_piece, y_piece, dw_piece;
  for (int64_t r = 0; r < 2; ++r) {
    std::vector<float> dy_r(n * half);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < half; ++c) dy_r[t * half + c] = dy[t * out + r * half + c];
    w_piece.push_back(std::make_unique<DeviceFloats>(
        allocator_, std::vector<float>(w.begin() + r * half * in, w.begin() + (r + 1) * half * in)));
    dy_piece.push_back(std::make_unique<DeviceFloats>(allocator_, dy_r));
    y_piece.push_back(std::make_unique<DeviceFloats>(allocator_, poison(n * half)));
    dw_piece.push_back(std::make_unique<DeviceFloats>(allocator_, std::vector<float>(half * in, 0.0f)));
  }
  DeviceFloats d_x(allocator_, x);
  comm::LaunchOptions options;
  options.backend = "threads";
  options.ranks = 2;
  comm::launch(options, [&](comm::Communicator& world) {
    const int r = world.rank();
    LinearPrecision piece(Recipe::Fp8Current);
    piece.set_device(Device::cuda(0));
    // The amax all-reduced is one device float: the group stages it through the host as the
    // trainer's does with runtime.device_comm=host.
    const std::unique_ptr<comm::Communicator> group = comm::stage_device_buffers(world, Device::cuda(0));
    piece.set_sharded_operands(group.get(), {false, true, true});  // input whole; weight, output gradient pieces
    piece.forward(y_piece[r]->ptr, d_x.ptr, w_piece[r]->ptr, nullptr, n, in, half);
    piece.backward(nullptr, dw_piece[r]->ptr, nullptr, dy_piece[r]->ptr, d_x.ptr, w_piece[r]->ptr, n, in, half);
  });
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<float> got_y = y_piece[r]->host(), got_dw = dw_piece[r]->host();
    std::vector<float> want_y(n * half);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < half; ++c) want_y[t * half + c] = y[t * out + r * half + c];
    const std::vector<float> want_dw(dw.begin() + r * half * in, dw.begin() + (r + 1) * half * in);
    EXPECT_LE(testing::relative_error(got_y, want_y), 1e-3) << "rank " << r << " forward";
    EXPECT_LE(testing::relative_error(got_dw, want_dw), 1e-3) << "rank " << r << " wgrad";
  }
}

// Per-tensor FP8 casts an activation once for two GEMMs: dgrad writes the output gradient's
// transposed codes for wgrad, and the forward the input's (DeviceTensors' keep / kept_input_codes).
// Each product equals the one cast per GEMM computes, bit for bit: wgrad alone (no dgrad to keep
// dout's codes) without kept input codes against the backward multiplying both kept codes.
TEST_F(CudaLinearPrecisionState, Fp8CodesCastOnceForTwoGemmsEqualACastPerGemmBitForBit) {
  const int64_t n = 48, in = 80, out = 64;
  for (Recipe recipe : {Recipe::Fp8Current, Recipe::Fp8Delayed}) {
    const std::string name = model::recipe_name(recipe);
    DeviceFloats x(allocator_, random_values(seed_, n * in, 1.0f)), w(allocator_, random_values(seed_ + 1, out * in, 0.1f));
    DeviceFloats dy(allocator_, random_values(seed_ + 2, n * out, 0.01f));
    const std::vector<float> dw0 = random_values(seed_ + 3, out * in, 0.001f);
    LinearPrecision per_gemm(recipe, 4, 1), kept(recipe, 4, 1);
    per_gemm.set_device(Device::cuda(0));
    kept.set_device(Device::cuda(0));
    ASSERT_TRUE(kept.keeps_input_codes());
    DeviceArray<uint8_t> codes(allocator_, std::vector<uint8_t>(kept.kept_input_bytes(n, in), 0xAB));
    DeviceFloats y_per_gemm(allocator_, poison(n * out)), y_kept(allocator_, poison(n * out));
    DeviceFloats dx_per_gemm(allocator_, poison(n * in)), dx_kept(allocator_, poison(n * in));
    DeviceFloats dw_per_gemm(allocator_, dw0), dw_kept(allocator_, dw0);
    per_gemm.forward(y_per_gemm.ptr, x.ptr, w.ptr, nullptr, n, in, out);
    per_gemm.backward(dx_per_gemm.ptr, nullptr, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out, model::GemmOutput::Rounded,
                      false);
    per_gemm.backward(nullptr, dw_per_gemm.ptr, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out);
    kept.forward(y_kept.ptr, x.ptr, w.ptr, nullptr, n, in, out, false, model::GemmOutput::Rounded,
                 model::DeviceTensors{.keep_input_codes = codes.ptr});
    kept.backward(dx_kept.ptr, dw_kept.ptr, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out, model::GemmOutput::Rounded, false,
                  model::DeviceTensors{.kept_input_codes = codes.ptr});
    const auto same = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << name << " " << what;
    };
    same(y_kept.host(), y_per_gemm.host(), "forward");
    same(dx_kept.host(), dx_per_gemm.host(), "dgrad");
    same(dw_kept.host(), dw_per_gemm.host(), "wgrad from both kept codes");
  }
}

// The weight gradient is added by its GEMM's epilogue into a 16-byte aligned main gradient, and by
// a finishing pass into one that is not (a tensor of a flat gradient buffer may start anywhere;
// FP8 products want 16 bytes): the same sum either way, up to the products' fp32 accumulation
// order.
TEST_F(CudaLinearPrecisionState, WeightGradientIntoAnUnalignedMainGradientIsTheAlignedOnesSum) {
  const int64_t n = 48, in = 80, out = 64;
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp8Current, Recipe::Mxfp8}) {
    const std::string name = model::recipe_name(recipe);
    DeviceFloats x(allocator_, random_values(seed_, n * in, 1.0f)), w(allocator_, random_values(seed_ + 1, out * in, 0.1f));
    DeviceFloats dy(allocator_, random_values(seed_ + 2, n * out, 0.01f));
    std::vector<float> dw0 = random_values(seed_ + 3, out * in, 0.001f);
    DeviceFloats aligned(allocator_, dw0);
    dw0.insert(dw0.begin(), 7.0f);  // the gradient one float in: 4-byte aligned
    DeviceFloats shifted(allocator_, dw0);
    LinearPrecision a(recipe, 4, 1), b(recipe, 4, 1);
    a.set_device(Device::cuda(0));
    b.set_device(Device::cuda(0));
    a.backward(nullptr, aligned.ptr, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out);
    b.backward(nullptr, shifted.ptr + 1, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out);
    const std::vector<float> got = shifted.host(), want = aligned.host();
    EXPECT_EQ(got[0], 7.0f) << name << ": the float before the gradient";
    EXPECT_LE(testing::relative_error(std::vector<float>(got.begin() + 1, got.end()), want), 1e-6) << name;
  }
}

// The optimizer's bf16 copy of a bias starts where its offset among the packed parameters puts it:
// a bf16 forward hands it to cuBLASLt's epilogue where it is 16-byte aligned and casts the fp32
// bias where it is not; the same output bit for bit at every alignment, and as with no copy.
TEST_F(CudaLinearPrecisionState, ABf16BiasCopyAtAnyAlignmentGivesTheForwardWithoutIt) {
  const int64_t n = 48, in = 80, out = 64;
  const std::vector<float> bias = random_values(seed_ + 2, out, 0.5f);
  DeviceFloats x(allocator_, random_values(seed_, n * in, 1.0f));
  DeviceFloats w(allocator_, random_values(seed_ + 1, out * in, 0.1f)), b(allocator_, bias);
  auto forward = [&](const void* bias16) {
    DeviceFloats y(allocator_, poison(n * out));
    kernels::PrecisionGemm g;
    g.pass = kernels::LinearGemm::Forward;
    g.out = y.ptr;
    g.bias = b.ptr;
    g.bias16 = bias16;
    g.a = kernels::CastOperand{.data = x.ptr, .cast = kernels::OperandCast::Bf16};
    g.b = kernels::CastOperand{.data = w.ptr, .cast = kernels::OperandCast::Bf16};
    g.n = n;
    g.in_features = in;
    g.out_features = out;
    g.rounding = kernels::OutputRounding::Bf16;
    kernels::precision_linear_gemm(Device::cuda(0), g);
    return y.host();
  };
  const std::vector<float> want = forward(nullptr);
  for (const int64_t shift : {0, 1, 4, 8}) {
    std::vector<float> copy(shift, 7.0f);  // the parameters before the bias in the packed copy
    const std::vector<float> rounded = testing::bf16_rounded(bias);
    copy.insert(copy.end(), rounded.begin(), rounded.end());
    DeviceArray<__nv_bfloat16> copy16(allocator_, testing::to_bf16(copy));
    EXPECT_EQ(forward(copy16.ptr + shift), want) << "the bias " << shift << " elements into the copy";
  }
}

// Per-tensor FP8 from a bf16 input (an activation bf16-valued anyway, kept bf16: attention's
// output under Attention::bf16_tensors), its codes kept, and its GEMMs' bf16 outputs (DeviceTensors'
// out, din): the products of the fp32 tensor holding the same values, rounded, bit for bit.
TEST_F(CudaLinearPrecisionState, Fp8FromABf16InputEqualsTheFp32InputOfItsValuesBitForBit) {
  const int64_t n = 48, in = 80, out = 64;
  for (Recipe recipe : {Recipe::Fp8Current, Recipe::Fp8Delayed}) {
    const std::string name = model::recipe_name(recipe);
    const std::vector<float> x_values = testing::bf16_rounded(random_values(seed_, n * in, 1.0f));
    DeviceFloats x(allocator_, x_values), w(allocator_, random_values(seed_ + 1, out * in, 0.1f));
    DeviceArray<__nv_bfloat16> x16(allocator_, testing::to_bf16(x_values));
    DeviceFloats dy(allocator_, random_values(seed_ + 2, n * out, 0.01f));
    const std::vector<float> dw0 = random_values(seed_ + 3, out * in, 0.001f);
    LinearPrecision from32(recipe, 4, 1), from16(recipe, 4, 1);
    from32.set_device(Device::cuda(0));
    from16.set_device(Device::cuda(0));
    ASSERT_TRUE(from16.accepts_bf16_input() && from16.gives_bf16_outputs());
    // The same fill in both: the store's padding after the codes and scale is never written.
    DeviceArray<uint8_t> codes32(allocator_, std::vector<uint8_t>(from32.kept_input_bytes(n, in), 0xAB));
    DeviceArray<uint8_t> codes16(allocator_, std::vector<uint8_t>(from16.kept_input_bytes(n, in), 0xAB));
    DeviceFloats y32(allocator_, poison(n * out)), dx32(allocator_, poison(n * in));
    DeviceArray<__nv_bfloat16> y16(allocator_, std::vector<__nv_bfloat16>(n * out)),
        dx16(allocator_, std::vector<__nv_bfloat16>(n * in));
    DeviceFloats dw32(allocator_, dw0), dw16(allocator_, dw0);
    from32.forward(y32.ptr, x.ptr, w.ptr, nullptr, n, in, out, false, model::GemmOutput::Rounded,
                   model::DeviceTensors{.keep_input_codes = codes32.ptr});
    from32.backward(dx32.ptr, dw32.ptr, nullptr, dy.ptr, x.ptr, w.ptr, n, in, out, model::GemmOutput::Rounded, false,
                    model::DeviceTensors{.kept_input_codes = codes32.ptr});
    from16.forward(nullptr, nullptr, w.ptr, nullptr, n, in, out, false, model::GemmOutput::Rounded,
                   model::DeviceTensors{.in = x16.ptr, .out = y16.ptr, .keep_input_codes = codes16.ptr});
    from16.backward(nullptr, dw16.ptr, nullptr, dy.ptr, nullptr, w.ptr, n, in, out, model::GemmOutput::Rounded, false,
                    model::DeviceTensors{.in = x16.ptr, .din = dx16.ptr, .kept_input_codes = codes16.ptr});
    EXPECT_EQ(codes16.host(), codes32.host()) << name << ": the kept codes and scale";
    EXPECT_EQ(testing::to_float(y16.host()), y32.host()) << name << ": forward (rounded to bf16 either way)";
    EXPECT_EQ(testing::to_float(dx16.host()), dx32.host()) << name << ": dgrad";
    const std::vector<float> got = dw16.host(), want = dw32.host();
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << name << ": wgrad";
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad})
      EXPECT_EQ(from16.pending_amax(op), from32.pending_amax(op)) << name << " operand " << static_cast<int>(op);
  }
}

// A forward adding into a new tensor from another (the residual stream's next tensor from its
// input: `addend`) equals copying that input into the output and adding into it, bit for bit:
// through cuBLASLt's bias epilogue and the finishing pass (bf16, per-tensor FP8), the finishing
// pass with the bias (fp16, blockwise FP8), the emulated MXFP8, an unrounded partial product (the
// product's own add) and an addend not 16-byte aligned (the one-element pass). The addend is
// left as it was.
TEST_F(CudaLinearPrecisionState, ForwardAddingANewTensorToAnAddendEqualsCopyingItFirstBitForBit) {
  const int64_t n = 128, in = 128, out = 128;  // fp8_blockwise's products take multiples of 128 only
  for (Recipe recipe : {Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Current, Recipe::Fp8Blockwise, Recipe::Mxfp8}) {
    for (const bool partial : {false, true}) {
      for (const int shift : {0, 1}) {
        const std::string name = model::recipe_name(recipe) + (partial ? " partial" : "") + (shift ? " shifted" : "");
        const model::GemmOutput output = partial ? model::GemmOutput::Partial : model::GemmOutput::Rounded;
        DeviceFloats x(allocator_, random_values(seed_, n * in, 1.0f));
        DeviceFloats w(allocator_, random_values(seed_ + 1, out * in, 0.1f));
        DeviceFloats b(allocator_, random_values(seed_ + 2, out, 0.5f));
        std::vector<float> residual = random_values(seed_ + 3, n * out + shift, 1.0f);
        DeviceFloats addend(allocator_, residual), copied(allocator_, residual);
        DeviceFloats fresh(allocator_, poison(n * out + shift));
        LinearPrecision a(recipe, 4, 1), c(recipe, 4, 1);
        a.set_device(Device::cuda(0));
        c.set_device(Device::cuda(0));
        const float* bias = partial ? nullptr : b.ptr;
        a.forward(fresh.ptr + shift, x.ptr, w.ptr, bias, n, in, out, true, output, {}, addend.ptr + shift);
        c.forward(copied.ptr + shift, x.ptr, w.ptr, bias, n, in, out, true, output);
        const std::vector<float> got = fresh.host(), want = copied.host();
        EXPECT_EQ(std::memcmp(got.data() + shift, want.data() + shift, n * out * sizeof(float)), 0) << name;
        EXPECT_EQ(addend.host(), residual) << name << ": the addend is read, not written";
      }
    }
  }
}

// Without a GPU: which cast each recipe gives each operand, and the shape rules.
TEST(CudaLinearPrecisionRouting, EachRecipeCastsEachOperandAsItsFormatsSay) {
  using model::device_cast;
  for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
    EXPECT_EQ(device_cast(Recipe::Bf16, op, 1.0f, 0).cast, OperandCast::Bf16);
    EXPECT_EQ(device_cast(Recipe::Fp16, op, 1.0f, 0).cast, OperandCast::Fp16);
    EXPECT_EQ(device_cast(Recipe::Mxfp8, op, 1.0f, 0).cast, OperandCast::Mxfp8);
    EXPECT_EQ(device_cast(Recipe::Fp8Blockwise, op, 1.0f, 0).cast,
              op == Operand::Weight ? OperandCast::Fp8Tiles : OperandCast::Fp8Blocks);
    for (Recipe r : {Recipe::Fp8Delayed, Recipe::Fp8Current}) {
      const CastOperand c = device_cast(r, op, 0.25f, 1);
      EXPECT_EQ(c.cast, OperandCast::Fp8Tensor);
      EXPECT_EQ(c.e5m2, op == Operand::OutputGrad);
      // fp8_delayed: the host's scale; fp8_current: the scale from the device amax the layer sets.
      EXPECT_EQ(c.scale, r == Recipe::Fp8Delayed ? 0.25f : 1.0f);
      EXPECT_EQ(c.margin, 1);
      EXPECT_EQ(c.amax, nullptr);
    }
  }
}

TEST(CudaLinearPrecisionRouting, Fp8ShapesCuBlasLtCannotTakeAreErrorsNamingThem) {
  auto message = [](Recipe r, int64_t n, int64_t in, int64_t out) {
    try {
      model::check_device_shape(r, n, in, out);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string per_tensor = message(Recipe::Fp8Current, 100, 64, 48);
  EXPECT_NE(per_tensor.find("precision.recipe=fp8_current on a GPU"), std::string::npos) << per_tensor;
  EXPECT_NE(per_tensor.find("multiple of 16"), std::string::npos) << per_tensor;
  EXPECT_NE(per_tensor.find("100 tokens, 64 input and 48 output features"), std::string::npos) << per_tensor;
  EXPECT_EQ(message(Recipe::Fp8Delayed, 96, 160, 208), "no error");
  const std::string blockwise = message(Recipe::Fp8Blockwise, 256, 384, 200);
  EXPECT_NE(blockwise.find("multiple of 128"), std::string::npos) << blockwise;
  EXPECT_NE(message(Recipe::Fp8Blockwise, 128, 64, 128).find("multiple"), std::string::npos);
  EXPECT_EQ(message(Recipe::Fp8Blockwise, 256, 384, 256), "no error");
  for (Recipe r : {Recipe::Bf16, Recipe::Fp16, Recipe::Mxfp8}) EXPECT_EQ(message(r, 77, 200, 136), "no error");
}

TEST(CudaLinearPrecisionRouting, TheDeviceEntriesRefuseTheCpu) {
  float x = 1.0f;
  try {
    kernels::amax(Device::cpu(), &x, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs on a GPU only"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kernels::precision_linear_gemm(Device::cpu(), PrecisionGemm{}), Error);
}

TEST(CudaLinearPrecisionRouting, TheCpuPathIgnoresTheDeviceEntries) {
  // A layer left on the CPU (the default) never reaches a device entry: its forward runs here.
  LinearPrecision lp(Recipe::Fp8Current);
  EXPECT_TRUE(lp.device().is_cpu());
  const std::vector<float> x = random_values(1, 4 * 8, 1.0f), w = random_values(2, 3 * 8, 1.0f);
  std::vector<float> out(4 * 3, NAN);
  lp.forward(out.data(), x.data(), w.data(), nullptr, 4, 8, 3);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
  model::PrecisionContext context;
  context.set_device(Device::cuda(0));
  EXPECT_TRUE(context.make(Recipe::Bf16, "layer")->device().is_cuda());  // layers take the context's device
}

}  // namespace
}  // namespace loom::kernels::cuda
