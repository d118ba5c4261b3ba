// The weight cast cache on the GPU (model/weight_cast_cache.h, kernels::CastStore): a layer whose
// weight casts are kept in stores (the first forward and dgrad write them, every later GEMM
// multiplies them without casting) computes what the same layer without the cache computes, bit
// for bit, in every recipe: forward, accumulated forward and backward over three micro-batches,
// and again after the weight changed and the scope was reopened. Sizes as the recipe's GEMMs
// take them (awkward where the format allows).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.h"
#include "precision_shapes.h"
#include "loom/model/linear_precision.h"

namespace loom::kernels::cuda {
namespace {

using model::LinearPrecision;
using model::PrecisionScratch;
using model::Recipe;
using testing::DeviceFloats;
using testing::random_values;
using testing::Sizes;
using testing::sizes_for;


void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0) << what;
}

class CudaWeightCasts : public testing::GpuTest<::testing::TestWithParam<Recipe>> {};

TEST_P(CudaWeightCasts, CachedWeightCastsEqualUncachedOnesBitForBit) {
  const Recipe recipe = GetParam();
  const Sizes s = sizes_for(recipe);
  const std::string name = model::recipe_name(recipe);
  auto scratch = std::make_shared<PrecisionScratch>();
  LinearPrecision plain(recipe, 4, 1), cached(recipe, 4, 1, scratch);
  plain.set_device(Device::cuda(0));
  cached.set_device(Device::cuda(0));
  for (int step = 0; step < 2; ++step) {
    DeviceFloats w(allocator_, random_values(seed_ + 100 * step, s.out * s.in, 0.1f));
    const std::vector<float> dw0 = random_values(seed_ + 100 * step + 1, s.out * s.in, 0.01f);
    DeviceFloats dw_plain(allocator_, dw0), dw_cached(allocator_, dw0);
    scratch->weight_casts.open();
    for (int m = 0; m < 3; ++m) {
      const std::string what = name + " step " + std::to_string(step) + " micro-batch " + std::to_string(m);
      const uint32_t seed = seed_ + 100 * step + 10 * m + 2;
      DeviceFloats x(allocator_, random_values(seed, s.n * s.in, 1.0f));
      DeviceFloats dy(allocator_, random_values(seed + 1, s.n * s.out, 0.01f));
      const std::vector<float> out0 = random_values(seed + 2, s.n * s.out, 0.1f);
      const std::vector<float> dx0 = random_values(seed + 3, s.n * s.in, 0.001f);
      DeviceFloats y_plain(allocator_, testing::poison(s.n * s.out));
      DeviceFloats y_cached(allocator_, testing::poison(s.n * s.out));
      DeviceFloats acc_plain(allocator_, out0), acc_cached(allocator_, out0);
      DeviceFloats dx_plain(allocator_, dx0), dx_cached(allocator_, dx0);
      for (auto [layer, y, acc, dx, dw] : {std::tuple{&plain, &y_plain, &acc_plain, &dx_plain, &dw_plain},
                                           std::tuple{&cached, &y_cached, &acc_cached, &dx_cached, &dw_cached}}) {
        layer->forward(y->ptr, x.ptr, w.ptr, nullptr, s.n, s.in, s.out);
        layer->forward(acc->ptr, x.ptr, w.ptr, nullptr, s.n, s.in, s.out, true);
        layer->backward(dx->ptr, dw->ptr, nullptr, dy.ptr, x.ptr, w.ptr, s.n, s.in, s.out);
      }
      expect_bitwise(y_cached.host(), y_plain.host(), what + ": forward");
      expect_bitwise(acc_cached.host(), acc_plain.host(), what + ": accumulated forward");
      expect_bitwise(dx_cached.host(), dx_plain.host(), what + ": dgrad");
    }
    EXPECT_GT(scratch->weight_casts.bytes_held(), 0) << name;
    scratch->weight_casts.close();
    expect_bitwise(dw_cached.host(), dw_plain.host(), name + " step " + std::to_string(step) + ": wgrad");
    for (model::Operand op : {model::Operand::Input, model::Operand::Weight, model::Operand::OutputGrad})
      EXPECT_EQ(cached.pending_amax(op), plain.pending_amax(op)) << name << " operand " << static_cast<int>(op);
  }
  // One store per form per step: the 16-bit copy serves forward and dgrad; FP8 and MX keep two
  // (per-tensor FP8's forward writes dgrad's transposed codes from its own read of the weight).
  EXPECT_EQ(scratch->weight_casts.casts_made(), recipe == Recipe::Bf16 || recipe == Recipe::Fp16 ? 2 : 4) << name;
}

INSTANTIATE_TEST_SUITE_P(EveryRecipe, CudaWeightCasts,
                         ::testing::Values(Recipe::Bf16, Recipe::Fp16, Recipe::Fp8Delayed, Recipe::Fp8Current,
                                           Recipe::Fp8Blockwise, Recipe::Mxfp8),
                         [](const ::testing::TestParamInfo<Recipe>& info) { return model::recipe_name(info.param); });

}  // namespace
}  // namespace loom::kernels::cuda
