// The weight cast cache (model/weight_cast_cache.h) on the emulated CUDA device: inside a scope a
// layer casts its weight once per form (forward; dgrad, transposed for FP8 and block-scaled forms)
// for four micro-batches with their recomputed forwards, and every GEMM equals the CPU's bit for
// bit; after the scope closes, new weight values (an optimizer step, written in place) are cast
// afresh; outside any scope nothing is kept.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loom/core/device.h"
#include "loom/core/error.h"
#include "loom/kernels/ops.h"
#include "loom/model/linear_precision.h"
#include "../gradient_check.h"
#include "support/emulated_cuda.h"
#include "support/emulated_precision.h"

namespace loom::model {
namespace {

constexpr Device kDevice = Device::cuda(0);
constexpr int kMicroBatches = 4;

// Normal values of the given spread (random_vector's arguments in this file's order).
std::vector<float> random_values(int64_t n, float stddev, uint32_t seed) { return testing::random_vector(n, seed, stddev); }

// A tensor held on the CPU and on the device, written to both.
struct Twin {
  DeviceBuffer<float> cpu, dev;
  explicit Twin(int64_t n) : cpu(Device::cpu(), n), dev(kDevice, n) {}
  void set(const std::vector<float>& v) {
    std::memcpy(cpu.data(), v.data(), v.size() * sizeof(float));
    copy_from_host(kDevice, dev.data(), v.data(), static_cast<int64_t>(v.size()));
  }
  void expect_equal(const std::string& what) const {
    std::vector<float> got(static_cast<size_t>(dev.size()));
    copy_to_host(kDevice, got.data(), dev.data(), dev.size());
    EXPECT_EQ(std::memcmp(got.data(), cpu.data(), got.size() * sizeof(float)), 0) << what;
  }
};

struct Shape {
  int64_t n, in, out;
};

Shape shape_of(Recipe r) {
  if (r == Recipe::Fp8Blockwise) return {128, 256, 128};
  if (r == Recipe::Fp8Delayed || r == Recipe::Fp8Current) return {48, 32, 64};
  return {37, 40, 24};
}

int forms_of(Recipe r) { return r == Recipe::Bf16 || r == Recipe::Fp16 ? 1 : 2; }
// The casts that make them: per-tensor FP8's forward writes dgrad's transposed codes from the same
// read (PrecisionGemm::b_store_transposed); the block-scaled forms are cast each on its own.
int casts_of(Recipe r) { return r == Recipe::Fp8Delayed || r == Recipe::Fp8Current ? 1 : forms_of(r); }

class WeightCastCacheTest : public ::testing::TestWithParam<Recipe> {
 protected:
  static void SetUpTestSuite() { ::loom::testing::install_emulated_cuda(); }
};

// One optimizer step's GEMMs of a layer: per micro-batch a forward, its recomputation and the
// backward, on the CPU and on the device; each micro-batch's outputs compared.
void micro_batches(LinearPrecision& cpu, LinearPrecision& dev, Twin& w, Twin& dw, const Shape& s, uint32_t seed) {
  Twin x(s.n * s.in), dy(s.n * s.out), y(s.n * s.out), dx(s.n * s.in);
  for (int m = 0; m < kMicroBatches; ++m) {
    x.set(random_values(s.n * s.in, 1.0f, seed + 10 * m));
    dy.set(random_values(s.n * s.out, 0.01f, seed + 10 * m + 1));
    dx.set(std::vector<float>(static_cast<size_t>(s.n * s.in), 0.0f));
    for (int pass = 0; pass < 2; ++pass) {  // the forward, then its recomputation
      cpu.forward(y.cpu.data(), x.cpu.data(), w.cpu.data(), nullptr, s.n, s.in, s.out);
      dev.forward(y.dev.data(), x.dev.data(), w.dev.data(), nullptr, s.n, s.in, s.out);
    }
    y.expect_equal("forward, micro-batch " + std::to_string(m));
    cpu.backward(dx.cpu.data(), dw.cpu.data(), nullptr, dy.cpu.data(), x.cpu.data(), w.cpu.data(), s.n, s.in, s.out);
    dev.backward(dx.dev.data(), dw.dev.data(), nullptr, dy.dev.data(), x.dev.data(), w.dev.data(), s.n, s.in, s.out);
    dx.expect_equal("dgrad, micro-batch " + std::to_string(m));
  }
  dw.expect_equal("accumulated wgrad");
}

TEST_P(WeightCastCacheTest, AWeightIsCastOncePerFormPerScopeAndAfreshAfterItCloses) {
  const Recipe recipe = GetParam();
  const Shape s = shape_of(recipe);
  auto scratch = std::make_shared<PrecisionScratch>();
  LinearPrecision cpu(recipe, 4, 1), dev(recipe, 4, 1, scratch);
  dev.set_device(kDevice);
  WeightCastCache& cache = scratch->weight_casts;
  Twin w(s.out * s.in), dw(s.out * s.in);
  dw.set(std::vector<float>(static_cast<size_t>(s.out * s.in), 0.0f));
  const int weight_gemms = kMicroBatches * 3;  // two forwards and a dgrad per micro-batch
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(recipe_name(recipe) + " step " + std::to_string(step));
    w.set(random_values(s.out * s.in, 0.2f * static_cast<float>(step + 1), 100 + step));  // in place: new values
    ::loom::testing::reset_emulated_weight_cast_counts();
    cache.open();
    micro_batches(cpu, dev, w, dw, s, 7 + step);
    EXPECT_GT(cache.bytes_held(), 0);
    cache.close();
    EXPECT_EQ(cache.bytes_held(), 0);
    const ::loom::testing::WeightCastCounts counts = ::loom::testing::emulated_weight_cast_counts();
    EXPECT_EQ(counts.cast, casts_of(recipe));
    EXPECT_EQ(counts.reused, weight_gemms - casts_of(recipe));
    float amaxes[3];
    for (Operand op : {Operand::Input, Operand::Weight, Operand::OutputGrad}) {
      EXPECT_EQ(dev.pending_amax(op), cpu.pending_amax(op)) << "operand " << static_cast<int>(op);
      amaxes[static_cast<int>(op)] = cpu.pending_amax(op);
    }
    cpu.commit_amaxes(amaxes);  // fp8_delayed's scales move between the steps
    dev.commit_amaxes(amaxes);
  }
  EXPECT_EQ(cache.casts_made(), 3 * forms_of(recipe));
  // Outside a scope every GEMM casts its weight, and sees it as it is now.
  ::loom::testing::reset_emulated_weight_cast_counts();
  w.set(random_values(s.out * s.in, 0.5f, 200));
  micro_batches(cpu, dev, w, dw, s, 300);
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, weight_gemms);
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().reused, 0);
  EXPECT_EQ(cache.casts_made(), 3 * forms_of(recipe));
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, WeightCastCacheTest,
                         ::testing::Values(Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current,
                                           Recipe::Fp8Blockwise, Recipe::Mxfp8),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return recipe_name(info.param); });

// A different weight at another address in the same layer, or the same layer's weight moved, is
// a cast of its own: the key is the layer, the address and the form.
TEST(WeightCastCacheKeys, AnotherAddressOrLayerIsAnotherCast) {
  ::loom::testing::install_emulated_cuda();
  auto scratch = std::make_shared<PrecisionScratch>();
  LinearPrecision a(Recipe::Bf16, 4, 0, scratch), b(Recipe::Bf16, 4, 0, scratch);
  a.set_device(kDevice);
  b.set_device(kDevice);
  const Shape s{8, 16, 8};
  Twin x(s.n * s.in), w1(s.out * s.in), w2(s.out * s.in), y(s.n * s.out);
  x.set(random_values(s.n * s.in, 1.0f, 1));
  w1.set(random_values(s.out * s.in, 1.0f, 2));
  w2.set(random_values(s.out * s.in, 1.0f, 3));
  scratch->weight_casts.open();
  ::loom::testing::reset_emulated_weight_cast_counts();
  for (LinearPrecision* layer : {&a, &b}) {
    for (const Twin* w : {&w1, &w2, &w1, &w2}) {
      layer->forward(y.dev.data(), x.dev.data(), w->dev.data(), nullptr, s.n, s.in, s.out);
      LinearPrecision cpu(Recipe::Bf16);
      cpu.forward(y.cpu.data(), x.cpu.data(), w->cpu.data(), nullptr, s.n, s.in, s.out);
      y.expect_equal("forward");
    }
  }
  scratch->weight_casts.close();
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 4);
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().reused, 4);
}

// A bf16 copy of the values a weight lies in (use_bf16_copy: the optimizer's copy of the
// parameters) serves the weight's bf16 casts in the scope: no cast, nothing held, the CPU's
// products bit for bit. The emulated device reads the copy's bytes: a copy that no longer holds
// the weight's values is an Error, not a silent product of old weights. Closing the scope leaves
// the copy alone; a weight outside it, or an fp16 cast, is cast as before.
TEST(WeightCastCacheBf16Copy, AWeightInsideTheCopyIsReadFromItAndAStaleCopyIsCaught) {
  ::loom::testing::install_emulated_cuda();
  auto scratch = std::make_shared<PrecisionScratch>();
  LinearPrecision layer(Recipe::Bf16, 4, 0, scratch);
  layer.set_device(kDevice);
  const Shape s{8, 16, 8};
  Twin x(s.n * s.in), values(2 * s.out * s.in), outside(s.out * s.in), y(s.n * s.out);
  x.set(random_values(s.n * s.in, 1.0f, 1));
  values.set(random_values(2 * s.out * s.in, 1.0f, 2));
  outside.set(random_values(s.out * s.in, 1.0f, 3));
  DeviceBuffer<uint16_t> copy(kDevice, values.dev.size());
  kernels::narrow_floats(kDevice, copy.data(), values.dev.data(), values.dev.size(), DType::BF16);
  const float* second = values.dev.data() + s.out * s.in;  // a weight in the middle of the values
  WeightCastCache& cache = scratch->weight_casts;
  cache.open();
  cache.use_bf16_copy(values.dev.data(), values.dev.size(), copy.data());
  ::loom::testing::reset_emulated_weight_cast_counts();
  LinearPrecision cpu(Recipe::Bf16);
  layer.forward(y.dev.data(), x.dev.data(), second, nullptr, s.n, s.in, s.out);
  cpu.forward(y.cpu.data(), x.cpu.data(), values.cpu.data() + s.out * s.in, nullptr, s.n, s.in, s.out);
  y.expect_equal("forward from the copy");
  layer.forward(y.dev.data(), x.dev.data(), outside.dev.data(), nullptr, s.n, s.in, s.out);
  cpu.forward(y.cpu.data(), x.cpu.data(), outside.cpu.data(), nullptr, s.n, s.in, s.out);
  y.expect_equal("forward of a weight outside the copy");
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().cast, 1);    // the weight outside
  EXPECT_EQ(::loom::testing::emulated_weight_cast_counts().reused, 1);  // the one inside
  EXPECT_EQ(cache.bytes_held(), kernels::weight_cast_layout(kernels::OperandCast::Bf16, s.out, s.in).bytes);
  cache.close();
  // The values change and the copy does not: read from it, that is an Error on the emulated device.
  values.set(random_values(2 * s.out * s.in, 1.0f, 4));
  cache.open();
  cache.use_bf16_copy(values.dev.data(), values.dev.size(), copy.data());
  EXPECT_THROW(layer.forward(y.dev.data(), x.dev.data(), second, nullptr, s.n, s.in, s.out), Error);
  cache.close();
  EXPECT_THROW(cache.use_bf16_copy(values.dev.data(), values.dev.size(), copy.data()), Error);  // no scope open
}

}  // namespace
}  // namespace loom::model
