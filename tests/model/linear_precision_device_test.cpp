// LinearPrecision on the emulated CUDA device (tests/support/emulated_cuda.h) against the same
// layer on the CPU. Finite operands: every recipe's forward (stored, accumulated, a partial
// product), dgrad (added, and written whole) and wgrad equal bit for bit, fp8_current's scale
// coming from the amax reduced on the device and fp8_delayed's amaxes accumulating there, read
// once per step for all layers (PrecisionContext::pending_amaxes), histories and scales equal
// after several steps; no GEMM reads an amax back (the host-read entry is removed while they
// run). An operand holding Inf or
// NaN: the device's outputs are NaN exactly where the CPU's are Inf or NaN (the CPU passes the
// operand on unquantized, the device's cast writes the element as NaN; finite outputs differ),
// and fp8_delayed's pending amax is Inf on both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda_entries.h"
#include "loom/kernels/ops.h"
#include "loom/model/linear_precision.h"
#include "../gradient_check.h"
#include "support/emulated_cuda.h"
#include "support/emulated_precision.h"

namespace loom::model {
namespace {

constexpr Device kDevice = Device::cuda(0);

// Normal values of the given spread (random_vector's arguments in this file's order).
std::vector<float> random_values(int64_t n, float stddev, uint32_t seed) { return testing::random_vector(n, seed, stddev); }

struct Data {
  int64_t n, in, out;
  std::vector<float> x, w, b, dy, dx0, dw0;
};

Data make_data(Recipe r, uint32_t seed) {
  Data d{};
  if (r == Recipe::Fp8Blockwise) {
    d.n = 128, d.in = 256, d.out = 128;
  } else if (r == Recipe::Fp8Delayed || r == Recipe::Fp8Current) {
    d.n = 48, d.in = 32, d.out = 64;
  } else {
    d.n = 37, d.in = 40, d.out = 24;
  }
  d.x = random_values(d.n * d.in, 1.0f, seed);
  d.w = random_values(d.out * d.in, 0.2f, seed + 1);
  d.b = random_values(d.out, 0.1f, seed + 2);
  d.dy = random_values(d.n * d.out, 0.01f, seed + 3);
  d.dx0 = random_values(d.n * d.in, 0.001f, seed + 4);
  d.dw0 = random_values(d.out * d.in, 0.001f, seed + 5);
  return d;
}

struct Result {
  std::vector<float> out, out_acc, partial, dx, dw, db;
  std::vector<float> dx_written, dx_from_zero;  // dgrad written whole into NaN; added onto zeros
};

// Host vectors where `device`'s kernels read them (copies on a GPU).
struct Placed {
  Device device;
  std::vector<DeviceBuffer<float>> held;
  float* put(const std::vector<float>& v) {
    if (device.is_cpu()) {
      held.emplace_back(Device::cpu(), static_cast<int64_t>(v.size()));
      std::memcpy(held.back().data(), v.data(), v.size() * sizeof(float));
    } else {
      held.emplace_back(device, static_cast<int64_t>(v.size()));
      copy_from_host(device, held.back().data(), v.data(), static_cast<int64_t>(v.size()));
    }
    return held.back().data();
  }
  std::vector<float> get(const float* p, int64_t n) const {
    std::vector<float> v(static_cast<size_t>(n));
    if (device.is_cpu()) {
      std::memcpy(v.data(), p, v.size() * sizeof(float));
    } else {
      copy_to_host(device, v.data(), p, n);
    }
    return v;
  }
};

Result run(LinearPrecision& lp, const Data& d) {
  Placed at{lp.device(), {}};
  const float *x = at.put(d.x), *w = at.put(d.w), *b = at.put(d.b), *dy = at.put(d.dy);
  float* out = at.put(std::vector<float>(d.n * d.out, NAN));
  float* out_acc = at.put(d.dy);
  float* partial = at.put(std::vector<float>(d.n * d.out, NAN));
  float *dx = at.put(d.dx0), *dw = at.put(d.dw0), *db = at.put(std::vector<float>(d.out, 0.0f));
  lp.forward(out, x, w, b, d.n, d.in, d.out);
  lp.forward(out_acc, x, w, nullptr, d.n, d.in, d.out, true);
  lp.forward(partial, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Partial);
  lp.backward(dx, dw, db, dy, x, w, d.n, d.in, d.out);
  float* dx_written = at.put(std::vector<float>(d.n * d.in, NAN));
  float* dx_from_zero = at.put(std::vector<float>(d.n * d.in, 0.0f));
  lp.backward(dx_written, nullptr, nullptr, dy, x, w, d.n, d.in, d.out, GemmOutput::Rounded, false);
  lp.backward(dx_from_zero, nullptr, nullptr, dy, x, w, d.n, d.in, d.out);
  return {at.get(out, d.n * d.out), at.get(out_acc, d.n * d.out), at.get(partial, d.n * d.out),
          at.get(dx, d.n * d.in),   at.get(dw, d.out * d.in),      at.get(db, d.out),
          at.get(dx_written, d.n * d.in), at.get(dx_from_zero, d.n * d.in)};
}

void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what;
}

void expect_bitwise(const Result& got, const Result& want, const std::string& what) {
  expect_bitwise(got.out, want.out, what + ": forward");
  expect_bitwise(got.out_acc, want.out_acc, what + ": accumulated forward");
  expect_bitwise(got.partial, want.partial, what + ": partial forward");
  expect_bitwise(got.dx, want.dx, what + ": dgrad");
  expect_bitwise(got.dw, want.dw, what + ": wgrad");
  expect_bitwise(got.db, want.db, what + ": bias gradient");
  expect_bitwise(got.dx_written, want.dx_written, what + ": dgrad written whole");
  // Written whole equals added onto zeros (== lets a zero's sign differ).
  for (const Result* r : {&got, &want}) {
    ASSERT_EQ(r->dx_written.size(), r->dx_from_zero.size());
    for (size_t i = 0; i < r->dx_written.size(); ++i)
      ASSERT_EQ(r->dx_written[i], r->dx_from_zero[i]) << what << ": dgrad written whole, element " << i;
  }
}

// Runs `body` with the entry that reads an amax back to the host removed: a GEMM that still
// called it would fail ("no CUDA kernel").
template <typename F>
void without_amax_reads(F body) {
  auto& entries = kernels::cuda_entries();
  const auto read = entries.amax;
  entries.amax = nullptr;
  body();
  entries.amax = read;
}

// One training step of a layer: the forward's output, and dgrad and wgrad added onto Data's.
struct Step {
  std::vector<float> out, dx, dw;
};
Step cpu_step(LinearPrecision& cpu, const Data& d) {
  Placed host{Device::cpu(), {}};
  float *o = host.put(std::vector<float>(d.n * d.out)), *dx = host.put(d.dx0), *dw = host.put(d.dw0);
  const float *hx = host.put(d.x), *hw = host.put(d.w), *hdy = host.put(d.dy);
  cpu.forward(o, hx, hw, nullptr, d.n, d.in, d.out);
  cpu.backward(dx, dw, nullptr, hdy, hx, hw, d.n, d.in, d.out);
  return {host.get(o, d.n * d.out), host.get(dx, d.n * d.in), host.get(dw, d.out * d.in)};
}
void expect_step(const Step& got, const Step& want, const std::string& what) {
  expect_bitwise(got.out, want.out, what + ": forward");
  expect_bitwise(got.dx, want.dx, what + ": dgrad");
  expect_bitwise(got.dw, want.dw, what + ": wgrad");
}
// The device layer's pending amaxes equal the CPU's; then each of `layers` commits the CPU's.
void commit_the_cpus_amaxes(const LinearPrecision& cpu, const LinearPrecision& dev,
                            std::initializer_list<LinearPrecision*> layers, const std::string& what) {
  float amaxes[3];
  for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
    amaxes[static_cast<int>(op)] = cpu.pending_amax(op);
    EXPECT_EQ(dev.pending_amax(op), cpu.pending_amax(op)) << what << " operand " << static_cast<int>(op);
  }
  for (LinearPrecision* lp : layers) lp->commit_amaxes(amaxes);
}

class LinearPrecisionDevice : public ::testing::TestWithParam<Recipe> {
 protected:
  static void SetUpTestSuite() { ::loom::testing::install_emulated_cuda(); }
};

TEST_P(LinearPrecisionDevice, GemmsEqualTheCpuBitForBitWithoutReadingAnAmaxBack) {
  const Recipe recipe = GetParam();
  LinearPrecision cpu(recipe, 4, 1), dev(recipe, 4, 1);
  dev.set_device(kDevice);
  for (int step = 0; step < 3; ++step) {
    Data d = make_data(recipe, 10 + step);
    for (float& v : d.dy) v *= std::ldexp(1.0f, 3 * step);  // ranges that move, so fp8 scales do
    const Result want = run(cpu, d);
    Result got;
    without_amax_reads([&] { got = run(dev, d); });
    expect_bitwise(got, want, recipe_name(recipe) + " step " + std::to_string(step));
    float amaxes[3];
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      amaxes[static_cast<int>(op)] = cpu.pending_amax(op);
      EXPECT_EQ(dev.pending_amax(op), cpu.pending_amax(op)) << "operand " << static_cast<int>(op);
    }
    cpu.commit_amaxes(amaxes);
    dev.commit_amaxes(amaxes);
    EXPECT_EQ(dev.pending_amax(Operand::Input), 0.0f);
  }
  if (recipe == Recipe::Fp8Delayed) {
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      EXPECT_EQ(dev.delayed_scaling(op).state().amax_history, cpu.delayed_scaling(op).state().amax_history);
      EXPECT_EQ(dev.scale(op), cpu.scale(op));
      EXPECT_NE(cpu.scale(op), 1.0f);  // the scales did move
    }
  }
}

// The 16-bit and per-tensor FP8 recipes cast a layer's output gradient once: dgrad keeps its copy
// (FP8: the transposed codes, from the same read), wgrad multiplies that (the bit-for-bit test
// above checks the product); the block-scaled recipes cast per GEMM.
TEST_P(LinearPrecisionDevice, OutputGradientIsCastOnceForBothBackwardGemmsWhereTheRecipeAllows) {
  const Recipe recipe = GetParam();
  LinearPrecision dev(recipe);
  dev.set_device(kDevice);
  const int64_t before = ::loom::testing::emulated_output_grad_reuses();
  run(dev, make_data(recipe, 21));  // one backward with both gradients, two with dgrad alone
  const bool once = recipe == Recipe::Bf16 || recipe == Recipe::Fp16 || recipe == Recipe::Fp8Delayed ||
                    recipe == Recipe::Fp8Current;
  EXPECT_EQ(::loom::testing::emulated_output_grad_reuses() - before, once ? 1 : 0) << recipe_name(recipe);
}

// Per-tensor FP8 keeps a layer's input codes from its forward for its weight gradient
// (DeviceTensors' keep / kept_input_codes): the forward, dgrad and wgrad equal the CPU's bit for
// bit with no second amax or cast of the input, fp8_delayed's pending amaxes too, at every tp
// reduction the input's amax would need; the other recipes and the CPU refuse the codes, and a
// wgrad given codes cast from other values than its input is caught (the emulated device checks).
TEST_P(LinearPrecisionDevice, Fp8InputCodesKeptFromTheForwardServeTheWeightGradient) {
  const Recipe recipe = GetParam();
  LinearPrecision dev(recipe, 4, 1);
  dev.set_device(kDevice);
  const Data d = make_data(recipe, 41);
  Placed at{kDevice, {}};
  const float *x = at.put(d.x), *w = at.put(d.w), *dy = at.put(d.dy);
  const bool keeps = recipe == Recipe::Fp8Delayed || recipe == Recipe::Fp8Current;
  ASSERT_EQ(dev.keeps_input_codes(), keeps);
  ASSERT_EQ(dev.kept_input_bytes(d.n, d.in) > 0, keeps);
  float* codes = at.put(std::vector<float>(d.n * d.in, NAN));  // room enough (1 byte + a scale per element)
  if (!keeps) {
    float* out = at.put(std::vector<float>(d.n * d.out, NAN));
    EXPECT_THROW(dev.forward(out, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                             DeviceTensors{.keep_input_codes = codes}),
                 Error);
    return;
  }
  LinearPrecision cpu(recipe, 4, 1);
  for (int step = 0; step < 2; ++step) {
    const Step want = cpu_step(cpu, d);
    float *out = at.put(std::vector<float>(d.n * d.out, NAN)), *dx = at.put(d.dx0), *dw = at.put(d.dw0);
    const int64_t reuses = ::loom::testing::emulated_input_code_reuses();
    without_amax_reads([&] {
      dev.forward(out, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                  DeviceTensors{.keep_input_codes = codes});
      dev.backward(dx, dw, nullptr, dy, x, w, d.n, d.in, d.out, GemmOutput::Rounded, true,
                   DeviceTensors{.kept_input_codes = codes});
    });
    EXPECT_EQ(::loom::testing::emulated_input_code_reuses() - reuses, 1);
    const std::string what = recipe_name(recipe) + " step " + std::to_string(step) + " (wgrad from the kept codes)";
    expect_step(Step{at.get(out, d.n * d.out), at.get(dx, d.n * d.in), at.get(dw, d.out * d.in)}, want, what);
    commit_the_cpus_amaxes(cpu, dev, {&cpu, &dev}, what);
  }
  // Codes kept from another input than the one the backward is given: a stale store.
  float* other = at.put(random_values(d.n * d.in, 1.0f, 99));
  float* dw = at.put(d.dw0);
  EXPECT_THROW(dev.backward(nullptr, dw, nullptr, dy, other, w, d.n, d.in, d.out, GemmOutput::Rounded, true,
                            DeviceTensors{.kept_input_codes = codes}),
               Error);
  LinearPrecision on_cpu(recipe);
  EXPECT_FALSE(on_cpu.keeps_input_codes());
}

// Per-tensor FP8: an amax taken by the operand's producer (here amax_into, as the activation's
// kernels do) where produced_amax gives, handed back as DeviceTensors' in_amax / dout_amax, stands
// for the layer's own amax pass: the same outputs, gradients and pending amaxes as the CPU's over
// two steps, two passes fewer (fp8_delayed's layer makes none of its own: its casts take them).
// Other recipes give no such float and refuse one; a float from elsewhere is refused.
TEST_P(LinearPrecisionDevice, Fp8AmaxesTakenByTheirProducersStandForTheAmaxPasses) {
  const Recipe recipe = GetParam();
  LinearPrecision dev(recipe, 4, 1);
  dev.set_device(kDevice);
  const Data d = make_data(recipe, 43);
  Placed at{kDevice, {}};
  const float *x = at.put(d.x), *w = at.put(d.w), *dy = at.put(d.dy);
  float* codes = at.put(std::vector<float>(d.n * d.in, NAN));
  float* elsewhere = at.put(std::vector<float>{0.0f});
  float* out = at.put(std::vector<float>(d.n * d.out, NAN));
  if (!dev.keeps_input_codes()) {
    EXPECT_EQ(dev.produced_amax(Operand::Input), nullptr);
    EXPECT_EQ(dev.produced_amax(Operand::OutputGrad), nullptr);
    EXPECT_THROW(dev.forward(out, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                             DeviceTensors{.in_amax = elsewhere}),
                 Error);
    return;
  }
  EXPECT_THROW(dev.produced_amax(Operand::Weight), Error);
  EXPECT_THROW(dev.forward(out, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                           DeviceTensors{.keep_input_codes = codes, .in_amax = elsewhere}),
               Error);
  LinearPrecision cpu(recipe, 4, 1), own(recipe, 4, 1);
  own.set_device(kDevice);
  for (int step = 0; step < 2; ++step) {
    const Step want = cpu_step(cpu, d);
    // The same layer taking its own amaxes, for the count of passes.
    ::loom::testing::reset_emulated_census();
    {
      float *o = at.put(std::vector<float>(d.n * d.out, NAN)), *dx = at.put(d.dx0), *dw = at.put(d.dw0);
      own.forward(o, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                  DeviceTensors{.keep_input_codes = codes});
      own.backward(dx, dw, nullptr, dy, x, w, d.n, d.in, d.out, GemmOutput::Rounded, true,
                   DeviceTensors{.kept_input_codes = codes});
    }
    const int64_t own_passes = ::loom::testing::emulated_census().entries["amax_into"];
    ::loom::testing::reset_emulated_census();
    float *dx = at.put(d.dx0), *dw = at.put(d.dw0);
    without_amax_reads([&] {
      float* in_amax = dev.produced_amax(Operand::Input);
      kernels::amax_into(kDevice, in_amax, x, d.n * d.in);  // the producer's
      dev.forward(out, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                  DeviceTensors{.keep_input_codes = codes, .in_amax = in_amax});
      float* dout_amax = dev.produced_amax(Operand::OutputGrad);
      kernels::amax_into(kDevice, dout_amax, dy, d.n * d.out);
      dev.backward(dx, dw, nullptr, dy, x, w, d.n, d.in, d.out, GemmOutput::Rounded, true,
                   DeviceTensors{.kept_input_codes = codes, .dout_amax = dout_amax});
    });
    // The two producers' passes stand for the layer's two under fp8_current; fp8_delayed's layer
    // makes none (its casts take the amaxes as they read), so the producers' are all there are.
    if (own.amax_taken_by_cast()) {
      EXPECT_EQ(own_passes, 0);
      EXPECT_EQ(::loom::testing::emulated_census().entries["amax_into"], 2);
    } else {
      EXPECT_EQ(::loom::testing::emulated_census().entries["amax_into"], own_passes);
    }
    const std::string what = recipe_name(recipe) + " step " + std::to_string(step);
    expect_step(Step{at.get(out, d.n * d.out), at.get(dx, d.n * d.in), at.get(dw, d.out * d.in)}, want, what);
    commit_the_cpus_amaxes(cpu, dev, {&cpu, &dev, &own}, what);
  }
}

TEST_P(LinearPrecisionDevice, AnInfOrNanOperandMakesNanExactlyWhereTheCpuIsNonFinite) {
  const Recipe recipe = GetParam();
  Data d = make_data(recipe, 3);
  d.x[5 * d.in + 3] = INFINITY;  // token 5 of the input
  d.dy[7 * d.out + 1] = NAN;     // token 7 of the output gradient
  LinearPrecision cpu(recipe), dev(recipe);
  dev.set_device(kDevice);
  const Result want = run(cpu, d), got = run(dev, d);
  auto same_non_finite = [&](const std::vector<float>& g, const std::vector<float>& w, const char* what) {
    int64_t non_finite = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      non_finite += !std::isfinite(w[i]);
      ASSERT_EQ(std::isfinite(g[i]), std::isfinite(w[i])) << recipe_name(recipe) << " " << what << " element " << i;
      // 16-bit recipes pass Inf through as the CPU does; the FP8 casts write NaN.
      if (is_fp8(recipe) && !std::isfinite(w[i])) {
        ASSERT_TRUE(std::isnan(g[i])) << what << " element " << i;
      }
    }
    EXPECT_GT(non_finite, 0) << recipe_name(recipe) << " " << what;
  };
  same_non_finite(got.out, want.out, "forward");
  same_non_finite(got.dx, want.dx, "dgrad");
  same_non_finite(got.dw, want.dw, "wgrad");
  if (recipe == Recipe::Fp8Delayed) {
    EXPECT_TRUE(std::isinf(dev.pending_amax(Operand::Input)));
    EXPECT_TRUE(std::isinf(dev.pending_amax(Operand::OutputGrad)));
    EXPECT_EQ(dev.pending_amax(Operand::Weight), cpu.pending_amax(Operand::Weight));
  }
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, LinearPrecisionDevice,
                         ::testing::Values(Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current,
                                           Recipe::Fp8Blockwise, Recipe::Mxfp8),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return recipe_name(info.param); });

// The bf16 recipe's tensors handed over in bf16 (DeviceTensors: a head's logits, an MLP's interior):
// each GEMM given a bf16 operand or asked for a bf16 output computes what the fp32 call computes,
// bit for bit: the forward's output (with a bias: rounded after it) and its input; the backward's
// output gradient (no cast: both GEMMs multiply it), input gradient and wgrad's input. The fp16
// recipe and the CPU do not take them.
TEST(LinearPrecisionDeviceBf16, GemmsOnBf16TensorsEqualTheFp32Calls) {
  ::loom::testing::install_emulated_cuda();
  const Data d = make_data(Recipe::Bf16, 31);
  LinearPrecision dev(Recipe::Bf16);
  dev.set_device(kDevice);
  ASSERT_TRUE(dev.takes_bf16_tensors());
  Placed at{kDevice, {}};
  const float *x = at.put(d.x), *w = at.put(d.w), *b = at.put(d.b), *dy = at.put(d.dy);
  // bf16 copies of x and dy (what the GEMMs cast them to), and of results read back widened.
  auto bf16_of = [&](const float* v, int64_t n) {
    float* h = at.put(std::vector<float>((n + 1) / 2, NAN));  // 2-byte elements
    kernels::narrow_floats(kDevice, h, v, n, DType::BF16);
    return h;
  };
  auto widened = [&](const float* h, int64_t n) {
    float* v = at.put(std::vector<float>(n, NAN));
    kernels::widen_floats(kDevice, v, h, n, DType::BF16, false);
    return at.get(v, n);
  };
  const float *x16 = bf16_of(x, d.n * d.in), *dy16 = bf16_of(dy, d.n * d.out);
  for (const float* bias : {static_cast<const float*>(nullptr), b}) {
    float* out = at.put(std::vector<float>(d.n * d.out, NAN));
    dev.forward(out, x, w, bias, d.n, d.in, d.out);
    float* out16 = at.put(std::vector<float>((d.n * d.out + 1) / 2, NAN));
    dev.forward(nullptr, x, w, bias, d.n, d.in, d.out, false, GemmOutput::Rounded, DeviceTensors{.out = out16});
    expect_bitwise(widened(out16, d.n * d.out), at.get(out, d.n * d.out), "forward's bf16 output");
    float* from16 = at.put(std::vector<float>(d.n * d.out, NAN));
    dev.forward(from16, nullptr, w, bias, d.n, d.in, d.out, false, GemmOutput::Rounded, DeviceTensors{.in = x16});
    expect_bitwise(at.get(from16, d.n * d.out), at.get(out, d.n * d.out), "forward from a bf16 input");
  }
  float *dx = at.put(d.dx0), *dw = at.put(d.dw0);
  dev.backward(dx, dw, nullptr, dy, x, w, d.n, d.in, d.out);
  // dout given in bf16: no cast for either GEMM.
  float *dx_given = at.put(d.dx0), *dw_given = at.put(d.dw0);
  const int64_t reuses = ::loom::testing::emulated_output_grad_reuses();
  dev.backward(dx_given, dw_given, nullptr, nullptr, x, w, d.n, d.in, d.out, GemmOutput::Rounded, true,
               DeviceTensors{.dout = dy16});
  EXPECT_EQ(::loom::testing::emulated_output_grad_reuses() - reuses, 2);
  expect_bitwise(at.get(dx_given, d.n * d.in), at.get(dx, d.n * d.in), "dgrad from a bf16 output gradient");
  expect_bitwise(at.get(dw_given, d.out * d.in), at.get(dw, d.out * d.in), "wgrad from a bf16 output gradient");
  // dgrad written whole in bf16, wgrad from a bf16 input.
  float* dx_whole = at.put(std::vector<float>(d.n * d.in, 0.0f));
  dev.backward(dx_whole, nullptr, nullptr, dy, x, w, d.n, d.in, d.out, GemmOutput::Rounded, false);
  float* dx16 = at.put(std::vector<float>((d.n * d.in + 1) / 2, NAN));
  float* dw_in16 = at.put(d.dw0);
  dev.backward(nullptr, dw_in16, nullptr, dy, nullptr, w, d.n, d.in, d.out, GemmOutput::Rounded, false,
               DeviceTensors{.in = x16, .din = dx16});
  expect_bitwise(widened(dx16, d.n * d.in), at.get(dx_whole, d.n * d.in), "dgrad's bf16 output");
  expect_bitwise(at.get(dw_in16, d.out * d.in), at.get(dw, d.out * d.in), "wgrad from a bf16 input");

  LinearPrecision fp16(Recipe::Fp16);
  fp16.set_device(kDevice);
  EXPECT_FALSE(fp16.takes_bf16_tensors());
  float* unused = at.put(std::vector<float>(d.n * d.out, NAN));
  EXPECT_THROW(fp16.forward(nullptr, x, w, nullptr, d.n, d.in, d.out, false, GemmOutput::Rounded,
                            DeviceTensors{.out = unused}),
               Error);
  EXPECT_FALSE(LinearPrecision(Recipe::Bf16).takes_bf16_tensors());  // on the CPU
}

// The context's delayed layers accumulate in one device array, read in one copy per step, and
// the commit clears it: the same amaxes, in the same order, as the CPU context's.
TEST(LinearPrecisionDeviceContext, PendingAmaxesOfAllLayersAreReadAtOnceAndEqualTheCpus) {
  ::loom::testing::install_emulated_cuda();
  PrecisionPolicy policy;
  policy.recipe = Recipe::Fp8Delayed;
  PrecisionContext cpu(policy), dev(policy);
  dev.set_device(kDevice);
  std::vector<std::shared_ptr<LinearPrecision>> cpu_layers, dev_layers;
  for (const char* name : {"a", "b", "c"}) {
    const Recipe r = std::string(name) == "b" ? Recipe::Bf16 : Recipe::Fp8Delayed;
    cpu_layers.push_back(cpu.make(r, name));
    dev_layers.push_back(dev.make(r, name));
  }
  for (int step = 0; step < 2; ++step) {
    cpu.clear_pending();
    dev.clear_pending();
    for (size_t l = 0; l < cpu_layers.size(); ++l) {
      const Data d = make_data(Recipe::Fp8Delayed, 40 + static_cast<uint32_t>(10 * l + step));
      const Result want = run(*cpu_layers[l], d), got = run(*dev_layers[l], d);
      expect_bitwise(got, want, "layer " + std::to_string(l));
    }
    const std::vector<float> want = cpu.pending_amaxes(), got = dev.pending_amaxes();
    ASSERT_EQ(want.size(), 6u);
    EXPECT_EQ(got, want) << "step " << step;
    cpu.commit_amaxes(want);
    dev.commit_amaxes(want);
    EXPECT_EQ(dev.pending_amaxes(), std::vector<float>(6, 0.0f));
  }
  EXPECT_EQ(dev.state(), cpu.state());
}

}  // namespace
}  // namespace loom::model
